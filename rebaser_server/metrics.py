"""Prometheus metrics of one daemon, served on ``/metrics`` by the health endpoint (``rebaser_server.http``).

Most numbers already exist: the daemon counts everything in :class:`~rebaser_server.runtime.Stats` and knows its
backlog from :class:`~rebaser_server.health.StatusReporter`. :class:`DaemonCollector` reads those at scrape time
instead of mirroring every ``+= 1`` into a second set of counters, so the request path stays as it is. Only what
``Stats`` cannot hold, the two latency histograms, is observed as it happens (:class:`RequestMetrics`).

Each daemon has its own :class:`~prometheus_client.CollectorRegistry`, not the process-wide default: several
daemons in one process (tests, an embedding application) must not clash or mix their numbers.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from rebaser_server.server import Daemon

__all__ = [
    "CONTENT_TYPE_LATEST",
    "STATS_METRICS",
    "DaemonCollector",
    "LightHistogram",
    "RequestMetrics",
    "render",
]

# Applying a request is usually milliseconds; a slow app or a group commit stretches it to seconds.
_PROCESSING_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    120.0,
)
# Waiting in the stream includes waiting for an owner (up to ack_wait after a crash) and for the requests ahead.
_QUEUE_WAIT_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
)


def _le(bound: float) -> str:
    """A bucket's ``le`` label as prometheus_client writes it."""
    text: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
    return text


class LightHistogram(Collector):
    """A histogram exported exactly as prometheus_client's ``Histogram`` exports one (buckets, count, sum,
    created), observed without its cost: ``Histogram.observe`` takes a lock for the sum and another for the
    bucket, found by a Python loop over the bounds. Two observations per request made that a measurable share of a
    daemon's CPU. Observed and scraped on the daemon's one event-loop thread (the health endpoint is aiohttp on
    that loop), so plain integers need no lock."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = (*sorted(buckets), math.inf)
        self._labels = tuple(map(_le, self._bounds))  # each bucket's le label, as the exposition writes it
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._created = time.time()

    def observe(self, amount: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, amount)] += 1  # the first bucket with le >= amount
        self._sum += amount

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation)
        cumulative, buckets = 0, []
        for label, count in zip(self._labels, self._counts, strict=True):
            cumulative += count
            buckets.append((label, cumulative))
        family.add_metric([], buckets, self._sum)
        family.add_sample(f"{self.name}_created", {}, self._created)
        yield family


class RequestMetrics:
    """The daemon's registry, and the histograms observed on the request path."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.processing = LightHistogram(
            "rebaser_request_processing_seconds",
            "Time to handle one request: decide, apply and stage (and commit and reply, unless grouped).",
            buckets=_PROCESSING_BUCKETS,
        )
        self.queue_wait = LightHistogram(
            "rebaser_request_queue_wait_seconds",
            "Time from a request's arrival in the requests stream until a daemon started handling it.",
            buckets=_QUEUE_WAIT_BUCKETS,
        )
        self.registry.register(self.processing)
        self.registry.register(self.queue_wait)
        self._bound = False

    def started(self, stored_at: float | None) -> float:
        """The handling of a request delivery starts: its queue wait observed (from ``stored_at``, when JetStream
        stored it, seconds since the epoch); returns the start for :meth:`ended`, which observes the processing
        time."""
        if stored_at is not None:
            self.queue_wait.observe(max(0.0, time.time() - stored_at))
        return time.monotonic()

    def ended(self, started: float) -> None:
        """The handling that :meth:`started` at ``started`` ended (also when it failed)."""
        self.processing.observe(time.monotonic() - started)

    def bind(self, daemon: Daemon) -> None:
        """Register the collector of ``daemon``'s counters and gauges (once, however many HTTP servers ask)."""
        if not self._bound:
            self.registry.register(DaemonCollector(daemon))
            self._bound = True


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
    "delete_failures": ("rebaser_delete_failures", "Failed purges of processed requests."),
    "lease_renewals": ("rebaser_lease_renewals", "Confirmed progress acks renewing a task lease."),
    "leases_lost": ("rebaser_leases_lost", "Task leases that ran out while owned."),
    "release_checks_failed": (
        "rebaser_release_checks_failed",
        "Releases whose 'anything queued?' check failed (the orphan sweep covers them).",
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
    "tasks_deferred": (
        "rebaser_tasks_deferred",
        "New-shard tasks handed back while their change set's old shard still held work (a layout change).",
    ),
}
_REQUEST_OUTCOMES = {
    "requests_ok": "ok",
    "requests_conflict": "conflict",
    "requests_error": "error",
    "requests_dead_lettered": "dead_lettered",
    "requests_replayed": "replayed",
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
}
# Task outcomes that nack the task (Outcome.hands_back).
_NACKS = ("tasks_retried", "tasks_interrupted", "tasks_wedged")
# Stats fields shown otherwise (or only on /status): requests_applied is the sum of ok, conflict and error.
_STATS_ELSEWHERE = frozenset(
    {*_REQUEST_OUTCOMES, *_TASK_OUTCOMES, "requests_applied", "last_request_at", "last_publish_at"}
)


class DaemonCollector(Collector):
    """Counters and gauges read from the daemon at scrape time."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    def collect(self) -> Iterator[Metric]:
        daemon = self._daemon
        stats = daemon.stats.as_dict()

        def count(field: str) -> float:
            return float(stats.get(field) or 0)

        requests = CounterMetricFamily(
            "rebaser_requests",
            "Requests handled, by outcome: ok, conflict, error (applied, by the reply's status), dead_lettered, "
            "replayed (answered from the record). A permanent app failure counts as error and dead_lettered.",
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

        settings = daemon.rt.settings
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
            "rebaser_nats_connected", "1 while connected to NATS.", value=float(daemon.watch.connected)
        )
        yield GaugeMetricFamily(
            "rebaser_settled_waits",
            "Settled queries this daemon holds now (each until its change set settles or it times out).",
            value=daemon.queries.settled.held,
        )
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


def render(metrics: RequestMetrics) -> bytes:
    """The registry in Prometheus text format."""
    return generate_latest(metrics.registry)
