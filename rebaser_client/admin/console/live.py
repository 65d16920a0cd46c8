"""The console's one set of NATS watches and reads, shared by every open browser (:class:`Live`).

- **Watches** (pushed by NATS): the change-set records (``REBASER_CHANGE_SETS``), the pauses (``REBASER_PAUSES``) and
  the event feed (every change set's new events, from the headers of the records' writes: docs/events.md).
- **Reads** (the console's own, once per ``refresh`` whatever the number of browsers): the streams' subject counts
  (:func:`~rebaser_client.admin.status.read_counts`), then, only for what changed, a task's sequence (owned or
  waiting) and a queue's first request (its age); every ``overview_every`` refreshes, ``rebaser status``'s report
  (:func:`~rebaser_client.admin.status.status_report`) for the overview.
- **The daemons' health** (``--daemon-url``): read by a loop of its own, every ``overview_every`` refreshes,
  whether or not the NATS reads succeed: a daemon that stopped shows as such even while NATS is away too.
- **Staleness**: while the NATS reads fail, what the pages show of the deployment is as of the last read that
  succeeded (:attr:`Live.read_at`); every page says so, with its age, and the live dot turns from green to amber
  (the ``health`` topic).
- A page's own reads (one change set's report, a list of dead letters, a change set's past events) are kept
  ``READ_TTL`` seconds and shared by the browsers that ask meanwhile.

What changed is published to the :class:`~rebaser_client.admin.console.hub.Hub` every ``FLUSH`` seconds: records
written many times a second cost one decode and one message per flush. Every loop survives NATS trouble: it says what
went wrong (:attr:`Live.problem`, shown on every page) and tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from nats.aio.client import Client as NatsClient
from nats.js import api as js_api
from nats.js.errors import BucketNotFoundError, NotFoundError

from rebaser_client._jetstream import consumer_upto, jetstream, task_seq_and_lane
from rebaser_client._record import RecordView
from rebaser_client._record_feed import FreshEvents, window_of_write
from rebaser_client.admin.console.hub import Hub
from rebaser_client.admin.console.index import Index, Row
from rebaser_client.admin.status import Counts, StatusReport, read_counts, status_report
from rebaser_client.admin.workspaces import DaemonsOwned, read_daemons_owned
from rebaser_core.errors import DecodeError, RebaserError
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats import cancellation
from rebaser_core.nats.bucket_watch import BucketWatch, stop_watch, watch_bucket
from rebaser_core.pauses import Pause, parse_key
from rebaser_core.subjects import Subjects

__all__ = ["FEED_OFF", "FLUSH", "READ_TTL", "SAMPLES", "Live", "Sample"]

SAMPLES = 600  # the samples the overview's charts draw at most: ten minutes at one refresh a second


@dataclass(frozen=True)
class Sample:
    """What the deployment looked like at one refresh, for the overview's charts (kept in memory, the newest
    :data:`SAMPLES`)."""

    at: float  # Unix seconds
    backlog: int  # requests queued, every change set's
    applied_per_s: float | None  # since the previous sample (None for the first): see Live._sample
    dead_letters: int
    owned: int  # change sets a daemon holds
    exact: bool  # applied_per_s counts applied events (the feed is on), not requests taken off the queues


log = logging.getLogger(__name__)
T = TypeVar("T")

FLUSH = 0.25  # seconds between two pushes of what changed
READ_TTL = 1.0  # a page's read is shared this long
_RETRY = 2.0  # a watch that failed (no bucket yet, NATS away) is started again after this long
_READS_PER_ROUND = 200  # task sequences and first requests read per refresh at most (the rest: next round)
_HISTORY_MAX = 500
_STOP_TIMEOUT = 10.0  # past events shown on a change set's page at most
FEED_OFF = (
    "No event feed yet: no daemon has started on this deployment (the feed is carried by the writes of the change "
    "sets' records). Everything else on these pages comes from the records, the pauses and the streams."
)


class Live:
    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        *,
        daemon_urls: Sequence[str] = (),
        refresh: float = 1.0,
        overview_every: int = 3,
    ) -> None:
        self.nc, self.subjects, self.js = nc, subjects, jetstream(nc)
        self.daemon_urls = tuple(daemon_urls)
        self.refresh, self.overview_every = refresh, overview_every
        self.index = Index()
        self.hub = Hub()
        self.counts: Counts | None = None
        self.report: StatusReport | None = None
        self.feed_on: bool | None = None  # None: not known yet
        self.records_loaded = False  # the records watch has delivered every record once
        self.problem: str | None = None  # the last thing that went wrong, until a refresh succeeds
        self.read_at: float | None = (
            None  # when the last refresh succeeded (Unix seconds): what is shown is as of
        )
        self.failing_since: float | None = (
            None  # when the refreshes started failing (None: the last one succeeded)
        )
        self.daemons: DaemonsOwned | None = None  # the daemons' health, read on its own (None: not read yet)
        self._raw_records: dict[str, bytes | None] = {}
        self._task_seqs: dict[tuple[str, str], tuple[int, int | None]] = {}  # (task seq, its lane)
        self._reads: dict[Any, tuple[float, asyncio.Future[Any]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._poked = asyncio.Event()
        self._dead_letters_seen: tuple[int | None, int] = (None, 0)
        self.samples: deque[Sample] = deque(maxlen=SAMPLES)
        self._applied_events = 0  # applied events the feed delivered
        self._fresh = FreshEvents(self.subjects)
        self._last_sample: tuple[float, int, int, bool] | None = None  # at, done, applied events, feed on

    async def start(self) -> None:
        for name, loop in (
            ("records", self._watch_records),
            ("pauses", self._watch_pauses),
            ("feed", self._follow_feed),
            ("refresh", self._refresh_loop),
            ("daemons", self._daemons_loop),
            ("flush", self._flush_loop),
        ):
            self._tasks.append(asyncio.create_task(loop(), name=f"console-{name}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                async with asyncio.timeout(_STOP_TIMEOUT):  # a loop that will not end is left, not waited for
                    await task
        self._tasks.clear()

    # -- the watches --------------------------------------------------------------------------------------------------
    async def _watch(
        self, bucket: str, apply: Callable[[str, bytes | None], None], loaded: Callable[[], None]
    ) -> None:
        """Follow every key of ``bucket`` (started again after any failure, the bucket created later included)."""
        while True:
            watcher: BucketWatch | None = None
            try:
                kv = await self.js.key_value(bucket)
                watcher = await watch_bucket(kv)
                async for entry in watcher:
                    if entry is None:
                        loaded()  # every key's last value is in: what follows are changes
                        continue
                    apply(entry.key, entry.value if entry.operation is None else None)
            except asyncio.CancelledError:
                raise
            except BucketNotFoundError:
                loaded()  # nothing to load: no daemon has created it yet
            except Exception as err:
                log.info("the watch of %s stopped (%r); it starts again", bucket, err)
            finally:
                if watcher is not None:
                    with contextlib.suppress(Exception):
                        await stop_watch(self.js, bucket, watcher)
            await cancellation.sleep(_RETRY)

    async def _watch_records(self) -> None:
        def keep(key: str, value: bytes | None) -> None:
            self._raw_records[key] = (
                value  # decoded at the next flush: a record written ten times is decoded once
            )

        def loaded() -> None:
            self.records_loaded = True

        await self._watch(self.subjects.change_sets_bucket, keep, loaded)

    async def _watch_pauses(self) -> None:
        def apply(key: str, value: bytes | None) -> None:
            target = parse_key(key)
            if target is None:
                return
            pause = None
            if value:
                try:
                    pause = Pause.decode(value)
                except DecodeError as err:
                    pause = Pause.unreadable(
                        err
                    )  # it holds all the same, as the daemons count it (fail closed)
            wk, cs = target
            self.index.apply_pause(str(wk), None if cs is None else str(cs), pause)

        await self._watch(self.subjects.pauses_bucket, apply, lambda: None)

    async def _follow_feed(self) -> None:
        """Every change set's new events, from the records' writes (headers only); looked for again while the
        deployment has no records yet."""
        while True:
            sub: Any = None
            try:
                await self.js.stream_info(self.subjects.records_stream)
                sub = await self.js.subscribe(
                    self.subjects.records_all,
                    stream=self.subjects.records_stream,
                    ordered_consumer=True,
                    deliver_policy=js_api.DeliverPolicy.NEW,
                    headers_only=True,
                )
                self._set_feed(True)
                while True:
                    msg = await sub.next_msg(timeout=None)
                    for event in self._fresh.of(msg):
                        wk, cs = str(event.workspace_id), str(event.change_set_id)
                        if event.kind == "applied":
                            self._applied_events += 1
                        self.index.apply_event(wk, cs, event.kind, event.owner, event.epoch)
                        self.hub.publish(f"cs:{wk}.{cs}", event)
            except asyncio.CancelledError:
                raise
            except NotFoundError:
                self._set_feed(False)
            except Exception as err:
                log.info("following the event feed stopped (%r); it starts again", err)
            finally:
                if sub is not None:
                    with contextlib.suppress(Exception):
                        await sub.unsubscribe()
            await cancellation.sleep(_RETRY)

    def _set_feed(self, on: bool) -> None:
        if self.feed_on != on:
            self.feed_on = on
            self.hub.publish("feed", on)

    # -- the reads ----------------------------------------------------------------------------------------------------
    async def _refresh_loop(self) -> None:
        rounds = 0
        while True:
            # A cancel lost in a NATS read (Python 3.11's wait_for, rebaser_core.nats.cancellation) would otherwise
            # be taken by the wait below for its own time running out, and the loop would outlive stop().
            cancellation.raise_lost_cancel()
            started = time.monotonic()
            problem: str | None = None
            try:
                await self.refresh_once(overview=rounds % self.overview_every == 0)
                self.read_at = time.time()
            except asyncio.CancelledError:
                raise
            except RebaserError as err:
                problem = f"{type(err).__name__}: {err}"
            except Exception as err:
                problem = f"reading the deployment failed: {err!r}"
                log.exception("a refresh failed")
            self._set_problem(problem)
            rounds += 1
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can turn a cancel that comes as the time runs
            # out into a TimeoutError, and the loop would then outlive stop().
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.05, self.refresh - (time.monotonic() - started))):
                    await self._poked.wait()
            self._poked.clear()

    def _set_problem(self, problem: str | None) -> None:
        """What went wrong in the last refresh (None: nothing); every page is told when that changes."""
        failing = problem is not None
        if failing and self.failing_since is None:
            self.failing_since = time.time()
        elif not failing:
            self.failing_since = None
        if problem != self.problem:
            self.problem = problem
            self.hub.publish("health", self.health())
            if self.report is not None:  # the overview says it is stale, or live again
                self.hub.publish("overview", self.report)

    def health(self) -> dict[str, Any]:
        """What the pages show of the console's own reads: the problem, and the time what they show is as of."""
        return {"problem": self.problem, "stale_since": self.read_at if self.problem else None}

    async def _daemons_loop(self) -> None:
        """The daemons' health endpoints, read on their own: not after the NATS reads, which may hang or fail."""
        if not self.daemon_urls:
            return
        while True:
            try:
                self.daemons = await asyncio.to_thread(read_daemons_owned, self.daemon_urls)
                if self.report is not None:
                    self.hub.publish("overview", self.report)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reading the daemons' health failed")
            await cancellation.sleep(self.refresh * self.overview_every)

    def poke(self) -> None:
        """Refresh now: an action changed something (the watches see pauses at once, the streams' counts not)."""
        self._poked.set()

    async def refresh_once(self, *, overview: bool = True) -> None:
        counts = await read_counts(self.nc, self.subjects)
        self.counts = counts
        self.index.apply_counts(counts.lines)
        dlq = counts.summaries[-1]
        if (dlq.messages, dlq.last_seq) != self._dead_letters_seen:
            self._dead_letters_seen = (dlq.messages, dlq.last_seq)
            self.hub.publish("dead-letters", None)
        await self._read_tasks(counts)
        await self._read_oldest(counts)
        self._sample(counts)
        if overview:
            self.report = await status_report(
                self.nc,
                self.subjects,
                limit=0,
                daemon_urls=self.daemon_urls,
                counts=counts,
                workspaces_limit=1000,
                pauses=(self.index.pauses(), False),  # watched already: not read again
                daemons=self.daemons if self.daemon_urls else None,  # read by _daemons_loop
                count_owners=False,  # the overview's daemons come from the index or their health endpoints
            )
            self.hub.publish("overview", self.report)

    def _sample(self, counts: Counts) -> None:
        """One sample for the charts. Requests applied per second: with the event feed on, its ``applied`` events
        (exact); without it, the requests that left the queues (stored ever, from the requests streams' last
        sequences, less those queued), applied or dead-lettered or purged alike."""
        now = time.time()
        backlog = sum(int(c.get("queued", 0)) for c in counts.lines.values())
        stored = sum(s.last_seq for s in counts.summaries[:-1][::2])  # each shard's requests, then its tasks
        done, applied, feed = stored - backlog, self._applied_events, bool(self.feed_on)
        rate: float | None = None
        if self._last_sample is not None:
            at, done_before, applied_before, feed_before = self._last_sample
            if now > at:
                moved = applied - applied_before if feed and feed_before else max(0, done - done_before)
                rate = moved / (now - at)
        self._last_sample = (now, done, applied, feed)
        owned = sum(1 for row in self.index.rows.values() if row.task == "owned")
        dead = counts.summaries[-1].messages or 0
        self.samples.append(Sample(now, backlog, rate, dead, owned, feed))

    async def _read_tasks(self, counts: Counts) -> None:
        """Owned or waiting: a task's sequence (read once per task) against its consumer's last delivered one."""
        with_task = {key for key, c in counts.lines.items() if c.get("task")}
        for key in list(self._task_seqs):
            if key not in with_task:
                del self._task_seqs[key]
        reads, fair_upto = 0, {}
        for key in sorted(with_task):
            row = self.index.rows[key]
            names = self.subjects.for_shard(row.shard)
            wk, cs = WorkspacePk(key[0]), ChangeSetId(key[1])
            if key not in self._task_seqs:
                if reads >= _READS_PER_ROUND:
                    continue
                reads += 1
                stored = await task_seq_and_lane(self.js, names, wk, cs)
                if stored is None:
                    continue
                self._task_seqs[key] = stored
            seq, lane = self._task_seqs[key]
            upto = counts.upto.get(row.shard)
            if upto is None:  # the fair or lanes intake: each workspace's or lane's consumer
                consumer = (row.shard, key[0])
                if consumer not in fair_upto:
                    fair_upto[consumer] = await consumer_upto(self.js, names, wk, lane=lane)
                upto = fair_upto[consumer]
            owned = upto is not None and seq <= upto
            self.index.set_task(row, "owned" if owned else "waiting")

    async def _read_oldest(self, counts: Counts) -> None:
        """When each queue's first request not yet processed was stored, for queues whose first one moved."""
        reads = 0
        for key, c in counts.lines.items():
            row = self.index.rows[key]
            if not c.get("queued") or row.oldest_at is not None or reads >= _READS_PER_ROUND:
                continue
            reads += 1
            wk, cs = WorkspacePk(key[0]), ChangeSetId(key[1])
            layout = counts.layout
            names = self.subjects if layout is None else self.subjects.for_shard(layout.shard_of(wk, cs))
            try:
                msg = await self.js.get_msg(
                    names.requests_stream,
                    seq=row.applied_seq + 1,
                    subject=names.requests(wk, cs),
                    next=True,
                    direct=True,
                )
            except NotFoundError:
                continue
            if msg.time is not None:
                self.index.set_oldest(row, msg.time.timestamp())

    async def _flush_loop(self) -> None:
        while True:
            await cancellation.sleep(FLUSH)
            self.flush()

    def flush(self) -> None:
        raw, self._raw_records = self._raw_records, {}
        for key, value in raw.items():
            wk, _, cs = key.partition(".")
            record = None
            if value:
                try:
                    record = RecordView.decode(value)
                except DecodeError:
                    log.info("record %s cannot be read", key)
            self.index.apply_record(wk, cs, record)
        changed = self.index.take_changed()
        if changed:
            self.hub.publish("rows", changed)

    # -- a page's reads -----------------------------------------------------------------------------------------------
    async def shared(self, key: Any, read: Callable[[], Awaitable[T]], *, newer_than: float = 0.0) -> T:
        """``read()``, or what it gave (or is giving) for the same ``key`` if that read started less than READ_TTL
        seconds ago and after ``newer_than`` (``time.monotonic()``: a change seen then must show)."""
        now = time.monotonic()
        for old in [k for k, (at, _) in self._reads.items() if now - at > READ_TTL]:
            del self._reads[old]
        found = self._reads.get(key)
        if found is None or found[0] < newer_than:
            future: asyncio.Future[Any] = asyncio.ensure_future(read())
            self._reads[key] = found = (now, future)
        result: T = await asyncio.shield(found[1])
        return result

    async def history(
        self, workspace_id: WorkspacePk, change_set_id: ChangeSetId, since: int | None
    ) -> list[Any]:
        """The change set's events the deployment keeps (the window its record's last write carries), after
        durable seq ``since`` (None: all of them, at most _HISTORY_MAX)."""
        try:
            raw = await self.js.get_last_msg(
                self.subjects.records_stream, self.subjects.record_subject(workspace_id, change_set_id)
            )
        except NotFoundError:
            return []
        window = window_of_write(raw.headers, workspace_id, change_set_id)
        if window is None:
            return []
        return [e for e in window.events if since is None or e.seq > since][-_HISTORY_MAX:]

    def row_of(self, workspace_id: str, change_set_id: str) -> Row | None:
        return self.index.rows.get((workspace_id, change_set_id))
