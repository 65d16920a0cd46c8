"""What the daemon knows about its own health: the NATS connection, the backlog in JetStream, readiness.

``/status`` and ``/readyz`` (``rebaser_server.ops.http``) are answered from here. The JetStream facts (tasks waiting,
requests waiting, dead letters) cost one API call each, so they are cached for ``_FACTS_TTL`` and fetched by one
caller at a time: a prober hammering ``/readyz`` costs JetStream at most a handful of calls a second. While NATS is
unreachable nothing is asked at all; the last facts are shown, marked stale.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.layout import Layout
from rebaser_core.nats import cancellation
from rebaser_core.nats.connect import connection_state, redact_url
from rebaser_core.nats.shard_info import shard_facts, tasks_consumer_info
from rebaser_core.settings import Settings
from rebaser_core.subjects import LANE_CONSUMER, Subjects

__all__ = ["ConnectionWatch", "JetStreamFacts", "StatusReporter"]

log = logging.getLogger(__name__)

_FACTS_TTL = 1.0
# The backlog of at most this many pauses is counted (one stream info per pause and shard, once a second at most).
_PAUSED_COUNTED = 50

# A status call must answer fast even when JetStream does not: /readyz takes at most this long (give probes a
# timeout above it), and a JetStream that cannot answer in time makes the daemon not ready.
_INFO_TIMEOUT = 2.0
_WATCH_INTERVAL = 0.1


class ConnectionWatch:
    """Follows a nats-py connection: since when it is down, and every reconnect.

    It polls the connection's public state instead of using nats-py's disconnected/reconnected callbacks, because
    those can only be installed by whoever opens the connection, and a daemon is handed connections opened
    elsewhere (by the CLI, by tests, by an embedding application). ``nc.stats["reconnects"]`` counts every
    reconnect, so even a blip shorter than the poll interval is seen.
    """

    def __init__(self, nc: NatsClient, *, interval: float = _WATCH_INTERVAL) -> None:
        self._nc = nc
        self._interval = interval
        self._down_since: float | None = None  # monotonic, for durations
        self.disconnected_at: float | None = None  # wall clock, for humans
        self.reconnects = self._reconnect_count()

    def _reconnect_count(self) -> int:
        return int(self._nc.stats.get("reconnects", 0))

    @property
    def connected(self) -> bool:
        return bool(self._nc.is_connected)

    def disconnected_for(self) -> float:
        """Seconds since the connection was last seen going down (0 while connected)."""
        return 0.0 if self._down_since is None else time.monotonic() - self._down_since

    def refresh(self) -> None:
        """Update "down since" from the connection's state (status calls it too, so it is never a poll behind)."""
        if not self.connected:
            if self._down_since is None:
                self._down_since, self.disconnected_at = time.monotonic(), time.time()
                log.warning("NATS connection lost (%s)", connection_state(self._nc))
        elif self._down_since is not None:
            log.warning("NATS connection back after %.1fs", self.disconnected_for())
            self._down_since, self.disconnected_at = None, None

    def observe(self) -> bool:
        """Refresh; True if the connection has reconnected since the last observation (only ``run`` asks this)."""
        self.refresh()
        if not self.connected:
            return False
        count = self._reconnect_count()
        if count == self.reconnects:
            return False
        self.reconnects = count
        return True

    async def run(self, on_reconnect: Callable[[], Awaitable[None]]) -> None:
        """Observe forever; run ``on_reconnect`` (one at a time) after every reconnect."""
        while True:
            if self.observe():
                try:
                    await on_reconnect()
                except Exception:
                    log.exception("handling a NATS reconnect failed")
            await cancellation.sleep(self._interval)


@dataclass(frozen=True)
class JetStreamFacts:
    """The backlog as JetStream reports it. ``None``: not known (never fetched, or that call failed)."""

    tasks_waiting: int | None = None  # tasks consumer num_pending: change sets waiting for an owner
    tasks_unacked: int | None = None  # tasks consumer num_ack_pending: change sets owned, cluster-wide
    requests_waiting: int | None = None  # messages in REBASER_REQUESTS (queued or being applied)
    requests_bytes: int | None = None
    dead_letters: int | None = None
    # Requests queued for paused change sets (and workspaces): they wait for a resume, not for a daemon.
    paused_backlog: int | None = None
    # Per shard: backlog, consumers, pull requests waiting and the stream leader (rebaser streams show, too).
    shards: tuple[dict[str, Any], ...] = ()
    # Shards with tasks waiting and no daemon pulling (pinned mode with its daemon down, or every daemon full).
    unserved_shards: tuple[int, ...] = ()
    missing: tuple[str, ...] = ()  # streams or the tasks consumer that do not exist
    error: str | None = None  # why some call failed (other than "not found")
    checked_at: float | None = None  # wall clock time of the fetch
    fetched_mono: float = field(default=0.0, repr=False)


class StatusReporter:
    """Cached JetStream facts plus the readiness rules (``Settings.ready_max_backlog``/``ready_max_disconnected``)."""

    def __init__(
        self,
        nc: NatsClient,
        settings: Settings,
        watch: ConnectionWatch,
        *,
        layout: Callable[[], Layout],
        paused: Callable[[], list[tuple[WorkspacePk, ChangeSetId | None]]] = list,
    ) -> None:
        self._nc = nc
        self._settings = settings
        # Shard 0's names and the shared ones; the layout is read at every fetch (it changes while serving).
        self._subjects: Subjects = settings.subjects
        self._layout = layout
        self._paused = paused
        self._js = nc.jetstream(timeout=_INFO_TIMEOUT)
        self.watch = watch
        # What an operator must repair (what -> what was found, naming its repair), e.g. an unreadable layout entry:
        # the daemon is not ready while any is here (the daemon shares its ShardPullers' dict).
        self.problems: dict[str, str] = {}
        self._facts = JetStreamFacts()
        self._lock = asyncio.Lock()

    async def facts(self) -> tuple[JetStreamFacts, bool]:
        """The JetStream facts and whether they are stale (NATS is down; these are the last ones known)."""
        self.watch.refresh()
        if not self.watch.connected:
            return self._facts, True
        async with self._lock:  # one fetch at a time; later callers take its result
            if time.monotonic() - self._facts.fetched_mono >= _FACTS_TTL or self._facts.checked_at is None:
                self._facts = await self._fetch()
        return self._facts, False

    def last_facts(self) -> tuple[JetStreamFacts, bool]:
        """The facts as last fetched, without asking JetStream (for /metrics, which refreshes them first)."""
        return self._facts, not self.watch.connected

    async def _fetch(self) -> JetStreamFacts:
        subjects = self._subjects
        layout = self._layout()
        shards = [subjects.for_shard(k) for k in layout.shards]
        calls: dict[str, Awaitable[Any]] = {
            subjects.dead_letter_stream: self._js.stream_info(subjects.dead_letter_stream)
        }
        # A shard's waiting and held tasks: its shared consumer's (fifo), or its lanes' added up. The fair intake has
        # a consumer per workspace instead: there they are not told apart here.

        def consumer_key(names: Subjects) -> str:
            consumer = names.tasks_consumer if layout.shared_consumer else f"{LANE_CONSUMER}-*"
            return f"consumer {names.tasks_stream}/{consumer}"

        for names in shards:
            calls[names.requests_stream] = self._js.stream_info(names.requests_stream)
            calls[names.tasks_stream] = self._js.stream_info(names.tasks_stream)
            consumer = tasks_consumer_info(self._js, names, layout)
            if consumer is not None:
                calls[consumer_key(names)] = consumer
        results = await asyncio.gather(*calls.values(), return_exceptions=True)
        answers = dict(zip(calls, results, strict=True))
        missing = tuple(name for name, r in answers.items() if isinstance(r, NotFoundError))
        errors = [
            f"{name}: {type(r).__name__} {r}".strip()
            for name, r in answers.items()
            if isinstance(r, BaseException) and not isinstance(r, NotFoundError)
        ]

        def ok(name: str) -> Any:
            result = answers.get(name)
            return None if isinstance(result, BaseException) else result

        per_shard = [
            shard_facts(
                names.shard,
                ok(names.requests_stream),
                ok(consumer_key(names)),
                ok(names.tasks_stream),
            )
            for names in shards
        ]
        dlq = ok(subjects.dead_letter_stream)
        paused_backlog = await self._paused_backlog(shards)

        def total(key: str) -> int | None:
            values = [s[key] for s in per_shard]
            return None if any(v is None for v in values) else sum(values)

        return JetStreamFacts(
            tasks_waiting=total("tasks_waiting"),
            tasks_unacked=total("tasks_unacked"),
            requests_waiting=total("requests_waiting"),
            requests_bytes=total("requests_bytes"),
            dead_letters=None if dlq is None else int(dlq.state.messages),
            paused_backlog=paused_backlog,
            shards=tuple(per_shard),
            unserved_shards=tuple(s["shard"] for s in per_shard if s["tasks_waiting"] and not s["pulling"]),
            missing=missing,
            error="; ".join(errors) or None,
            checked_at=time.time(),
            fetched_mono=time.monotonic(),
        )

    async def _paused_backlog(self, shards: list[Subjects]) -> int | None:
        """Requests queued for what is paused (the first _PAUSED_COUNTED pauses; None if a count failed)."""
        total = 0
        for workspace, change_set in self._paused()[:_PAUSED_COUNTED]:
            for names in shards:
                subject = (
                    names.requests_of_workspace(workspace)
                    if change_set is None
                    else names.requests(workspace, change_set)
                )
                try:
                    info = await self._js.stream_info(names.requests_stream, subjects_filter=subject)
                except (nats.errors.Error, TimeoutError, NotFoundError):
                    return None
                total += sum((info.state.subjects or {}).values())
        return total

    def not_ready(
        self,
        facts: JetStreamFacts,
        stale: bool,
        *,
        stopping: bool,
        serving: bool = True,
        owned: int = 0,
        workspaces_waiting: int = 0,
    ) -> list[str]:
        """Why the daemon is not ready (empty: ready). A disconnect shorter than ``ready_max_disconnected`` is
        tolerated: nats-py reconnects by itself and nothing acknowledged is lost meanwhile."""
        settings = self._settings
        reasons = []
        if stopping:
            reasons.append("shutting down")
        elif not serving:
            # The streams of an earlier run may all be there already: not ready until queries are answered too.
            reasons.append("starting: set-up not done (JetStream, the app, the query service, the intake)")
        reasons.extend(self.problems.values())
        down, limit = self.watch.disconnected_for(), settings.ready_max_disconnected
        if down > limit:
            reasons.append(f"NATS unreachable for {down:.1f}s (ready_max_disconnected {limit:g}s)")
        if not stale:
            if facts.missing:
                reasons.append(f"missing in JetStream: {', '.join(facts.missing)}")
            if facts.error:
                reasons.append(f"JetStream not answering: {facts.error}")
        waiting = facts.tasks_waiting
        if owned >= settings.concurrency and waiting:
            reasons.append(
                f"full: all {settings.concurrency} change-set slots taken (concurrency) while {waiting} change sets "
                "wait for an owner"
            )
        elif owned >= settings.concurrency and workspaces_waiting:
            # The fair intake: no shared consumer counts the waiting tasks; the workspaces in line say some wait.
            reasons.append(
                f"full: all {settings.concurrency} change-set slots taken (concurrency) while {workspaces_waiting} "
                "workspaces wait for a turn"
            )
        backlog = facts.requests_waiting
        if backlog is not None and facts.paused_backlog:
            backlog -= facts.paused_backlog  # it waits for a resume, not for a daemon
        if settings.ready_max_backlog >= 0 and backlog is not None and backlog > settings.ready_max_backlog:
            reasons.append(f"{backlog} requests waiting (ready_max_backlog {settings.ready_max_backlog})")
        return reasons

    def connection(self) -> dict[str, Any]:
        nc = self._nc
        return {
            "state": connection_state(nc),
            "url": None if nc.connected_url is None else redact_url(nc.connected_url.netloc),
            "disconnected_at": self.watch.disconnected_at,
            "disconnected_for": round(self.watch.disconnected_for(), 3),
            "reconnects": self.watch.reconnects,
            "pending_bytes": nc.pending_data_size,
        }

    @staticmethod
    def facts_dict(facts: JetStreamFacts, stale: bool) -> dict[str, Any]:
        out = asdict(facts)
        out.pop("fetched_mono", None)
        out["missing"] = list(facts.missing)
        out["shards"] = list(facts.shards)
        out["unserved_shards"] = list(facts.unserved_shards)
        out["stale"] = stale
        out["age"] = None if facts.checked_at is None else round(time.time() - facts.checked_at, 3)
        return out
