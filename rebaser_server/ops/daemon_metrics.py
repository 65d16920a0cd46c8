"""The daemon's counters and gauges for ``/metrics``, read at scrape time through
:class:`~rebaser_server.ops.view.DaemonView`.

The daemon counts everything in its ``Stats`` and knows its backlog from
:class:`~rebaser_server.ops.health.StatusReporter`; :class:`DaemonCollector` reads those when Prometheus scrapes,
instead of mirroring every ``+= 1`` into a second set of counters, so the request path stays as it is.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rebaser_core.nats.durability import DURABILITY_LEVELS
from rebaser_core.pauses import PAUSE_CAUSES
from rebaser_server.ops.status import top_workspaces
from rebaser_server.ops.view import DaemonView

__all__ = ["STATS_METRICS", "DaemonCollector"]


# Stats field -> (metric name without _total, help). Fields mapped elsewhere are listed in _STATS_ELSEWHERE.
STATS_METRICS: dict[str, tuple[str, str]] = {
    "tasks_taken": ("rebaser_tasks_taken", "Change-set tasks taken (each one an ownership of a change set)."),
    "tasks_released": ("rebaser_tasks_released", "Change sets released after going quiet (task acked)."),
    "unclean_takeovers": (
        "rebaser_takeovers",
        "Change sets taken over from an owner that died or froze (no hand-back).",
    ),
    "tasks_fenced": ("rebaser_fenced", "Tasks ended because another daemon had taken the change set over."),
    "request_commits": (
        "rebaser_request_commits",
        "Record commits for requests (fewer than requests: groups).",
    ),
    "requests_retried": ("rebaser_requests_retried", "Retryable request failures (the request stays first)."),
    "dead_letter_failures": ("rebaser_dead_letter_failures", "Dead-letter copies given up."),
    "dead_letters_evicted": (
        "rebaser_dead_letters_evicted",
        "Dead letters purged to keep their workspace at dead_letter_max_per_workspace.",
    ),
    "stored_batches_deleted": (
        "rebaser_stored_batches_deleted",
        "Stored batches deleted by the batch sweep: unfinished, or over their workspace's share.",
    ),
    "delete_failures": ("rebaser_delete_failures", "Failed purges of processed requests."),
    "lease_renewals": ("rebaser_lease_renewals", "Confirmed progress acks renewing a task lease."),
    "leases_lost": ("rebaser_leases_lost", "Task leases that ran out while owned."),
    "release_checks_failed": (
        "rebaser_release_checks_failed",
        "Releases whose 'anything queued?' check failed (the orphan sweep covers them).",
    ),
    "events_published": ("rebaser_events_published", "Change-set events published and stored (the feed)."),
    "event_publish_failures": (
        "rebaser_event_publish_failures",
        "Change-set event publications that failed (durable ones are published again).",
    ),
    "dvu_runs": ("rebaser_dvu_runs", "Dependent-values-update runs committed."),
    "dvu_failures": ("rebaser_dvu_failures", "Dependent-values-update runs that failed."),
    "nats_reconnects": ("rebaser_nats_reconnects", "Reconnects to NATS."),
    "reconnect_handbacks": (
        "rebaser_reconnect_handbacks",
        "Owned change sets handed back after a reconnect.",
    ),
    "consumer_resets": (
        "rebaser_consumer_resets",
        "Request consumers replaced after a lost delivery or two missed heartbeats.",
    ),
    "tasks_deferred_fair_share": (
        "rebaser_tasks_deferred_fair_share",
        "Tasks handed back with a delay: their workspace owned max_owned_per_workspace change sets here.",
    ),
    "silent_peers": ("rebaser_silent_peers", "Peer daemons found silent (lease_mode daemon)."),
    "peer_tasks_handed_back": (
        "rebaser_peer_tasks_handed_back",
        "Tasks of silent peer daemons handed back (lease_mode daemon).",
    ),
    "lapse_hand_backs": (
        "rebaser_lapse_hand_backs",
        "Tasks this daemon handed back itself after its heartbeat lapsed (lease_mode daemon).",
    ),
    "records_unreadable": (
        "rebaser_records_unreadable",
        "Change sets quarantined because their record could not be read (paused, cause record_unreadable).",
    ),
    "tasks_deferred": (
        "rebaser_tasks_deferred",
        "New-shard tasks handed back while their change set's old shard still held work (a layout change).",
    ),
}
_REQUEST_OUTCOMES = {
    "requests_ok": "ok",
    "requests_conflict": "conflict",
    "requests_error": "error",
    "requests_refused": "refused",
    "requests_dead_lettered": "dead_lettered",
    # The stats field keeps the decision's name (Decision.REPLAYED); the label says what it is, so it is not read as
    # a dead letter's replay (`rebaser dlq replay`): a redelivered or resent request answered from the record.
    "requests_replayed": "answered_from_record",
}
_TASK_OUTCOMES = {
    "tasks_released": "released",
    "tasks_retried": "retry",
    "tasks_interrupted": "interrupted",
    "tasks_wedged": "wedged",
    "tasks_fenced": "fenced",
    "tasks_lease_lost": "lease_lost",
    "tasks_stale": "stale",
    "tasks_dropped": "dropped",
    "tasks_paused": "paused",
}
# Task outcomes that nack the task (Outcome.hands_back).
_NACKS = ("tasks_retried", "tasks_interrupted", "tasks_wedged")
# Stats fields shown otherwise (or only on /status): requests_applied is the sum of ok, conflict and error.
_STATS_ELSEWHERE = frozenset(
    {*_REQUEST_OUTCOMES, *_TASK_OUTCOMES, "requests_applied", "last_request_at", "last_publish_at"}
)


class DaemonCollector(Collector):
    """Counters and gauges read from the daemon at scrape time."""

    def __init__(self, daemon: DaemonView) -> None:
        self._daemon = daemon

    def collect(self) -> Iterator[Metric]:
        daemon = self._daemon
        stats = daemon.stats.as_dict()

        def count(field: str) -> float:
            return float(stats.get(field) or 0)

        requests = CounterMetricFamily(
            "rebaser_requests",
            "Requests handled, by outcome: ok, conflict, error, refused (applied, by the reply's status), "
            "dead_lettered, "
            "answered_from_record (a redelivered or resent request, answered with its recorded reply, not applied "
            "again). A permanent app failure counts as error and dead_lettered.",
            labels=["outcome"],
        )
        for field, outcome in _REQUEST_OUTCOMES.items():
            requests.add_metric([outcome], count(field))
        yield requests

        tasks = CounterMetricFamily(
            "rebaser_task_outcomes", "How owned change-set tasks ended, by outcome.", labels=["outcome"]
        )
        for field, outcome in _TASK_OUTCOMES.items():
            tasks.add_metric([outcome], count(field))
        yield tasks
        yield CounterMetricFamily(
            "rebaser_task_nacks",
            "Tasks handed back with a nack (retry, shutdown or reconnect, wedged step).",
            value=sum(count(f) for f in _NACKS),
        )
        for field, (name, documentation) in STATS_METRICS.items():
            yield CounterMetricFamily(name, documentation, value=count(field))

        settings = daemon.settings
        yield GaugeMetricFamily(
            "rebaser_owned_change_sets", "Change sets this daemon owns now.", value=len(daemon.owned)
        )
        yield GaugeMetricFamily(
            "rebaser_concurrency", "Change sets this daemon may own at once.", value=settings.concurrency
        )
        yield GaugeMetricFamily(
            "rebaser_starting_change_sets",
            "Change sets this daemon took on whose first request has not yet arrived (at most start_concurrency).",
            value=daemon.starting,
        )
        yield GaugeMetricFamily(
            "rebaser_nats_connected", "1 while connected to NATS.", value=float(daemon.health.watch.connected)
        )
        yield GaugeMetricFamily(
            "rebaser_settled_waits",
            "Settled queries this daemon holds now (each until its change set settles or it times out).",
            value=daemon.settled_waits,
        )
        busiest = GaugeMetricFamily(
            "rebaser_owned_change_sets_by_workspace",
            "Change sets this daemon owns now, for its 10 busiest workspaces.",
            labels=["workspace"],
        )
        for workspace, owned in top_workspaces(daemon.owned_by_workspace).items():
            busiest.add_metric([workspace], owned)
        yield busiest
        with_tasks = GaugeMetricFamily(
            "rebaser_tasks_by_workspace",
            "Tasks in the served shards' streams (owned by any daemon, or waiting), for the 10 busiest workspaces, as "
            "last read (at most once a second, by /status or while a workspace is at its share).",
            labels=["workspace"],
        )
        for workspace, n_tasks in top_workspaces(daemon.tasks_seen_by_workspace).items():
            with_tasks.add_metric([workspace], n_tasks)
        yield with_tasks
        served = GaugeMetricFamily(
            "rebaser_tasks_taken_lately_by_workspace",
            "Tasks this daemon took lately (each counting half as much every minute), for the 10 workspaces served "
            "most: divided by their sum, the share each is served.",
            labels=["workspace"],
        )
        for workspace, taken in top_workspaces(daemon.served_by_workspace).items():
            served.add_metric([workspace], taken)
        yield served
        intake = daemon.intake_status()
        yield GaugeMetricFamily(
            "rebaser_workspaces_waiting_for_a_turn",
            "Fair intake: workspaces with tasks waiting for their turn on this daemon (0 with the fifo intake).",
            value=int(intake.get("workspaces_waiting_total") or 0),
        )
        change_sets, workspaces = daemon.pauses.counts
        paused = GaugeMetricFamily(
            "rebaser_paused", "Paused change sets and workspaces, as this daemon sees them.", labels=["kind"]
        )
        paused.add_metric(["change_set"], change_sets)
        paused.add_metric(["workspace"], workspaces)
        yield paused
        pauses = CounterMetricFamily(
            "rebaser_pauses", "Pauses seen appear since start-up, by cause.", labels=["cause"]
        )
        for cause in PAUSE_CAUSES:
            pauses.add_metric([cause], daemon.pauses.pauses.get(cause, 0))
        yield pauses
        yield GaugeMetricFamily(
            "rebaser_pauses_unreadable",
            "Keys of the pauses bucket that hold no readable pause: each counts as paused until it is repaired.",
            value=daemon.pauses.unreadable,
        )
        durability = daemon.durability
        if durability is not None:
            # A state set (one series per level, 1 for the current one): alert on rebaser_durability{level=...}.
            gauge = GaugeMetricFamily(
                "rebaser_durability",
                "What an acknowledged request survives, as last checked (start-up and every reconnect): "
                "process-crash, unknown (one replica, sync setting not readable), node-loss, power-loss.",
                labels=["level"],
            )
            for level in DURABILITY_LEVELS:
                gauge.add_metric([level], float(level == durability.level))
            yield gauge
        last = stats.get("last_request_at")
        if last is not None:
            yield GaugeMetricFamily(
                "rebaser_last_request_timestamp_seconds", "When the last request was answered.", value=last
            )

        # The backlog as last fetched from JetStream (the /metrics handler refreshes it first, at most once a
        # second); a number JetStream did not give is left out rather than shown as 0.
        facts, stale = daemon.health.last_facts()
        for name, documentation, value in (
            ("rebaser_tasks_waiting", "Change sets waiting for an owner.", facts.tasks_waiting),
            ("rebaser_tasks_unacked", "Change sets owned, cluster-wide.", facts.tasks_unacked),
            ("rebaser_requests_waiting", "Requests in the requests stream.", facts.requests_waiting),
            ("rebaser_requests_waiting_bytes", "Bytes in the requests stream.", facts.requests_bytes),
            ("rebaser_dead_letters", "Messages in the dead-letter stream.", facts.dead_letters),
        ):
            if value is not None:
                yield GaugeMetricFamily(name, documentation, value=value)
        yield GaugeMetricFamily(
            "rebaser_backlog_stale",
            "1 when the backlog gauges are the last known (NATS is down).",
            value=float(stale),
        )
