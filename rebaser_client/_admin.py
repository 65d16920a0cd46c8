"""What JetStream holds for one deployment, read for operators: ``rebaser status`` and ``change-set show`` (dead
letters are read by ``_admin_dlq``).

Read-only, and every call has a deadline (the JetStream context's timeout). Results are plain dataclasses; turning
them into tables or JSON is ``_admin_format``'s job. Lists are bounded (``limit``): a deployment may hold millions
of queued requests, and an operator's command must answer in seconds.

The change-set record is read through :class:`~rebaser_client._admin_record.RecordView`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NoKeysError, NotFoundError

from rebaser_client._admin_record import RecentReply, RecordView
from rebaser_client._admin_workspaces import (
    DaemonsOwned,
    WorkspaceLine,
    busiest_workspaces,
    read_daemons_owned,
)
from rebaser_client._pause_read import PausedLine, all_pauses, pauses_of
from rebaser_client._routing import fetch_layout, routed
from rebaser_core import headers as h
from rebaser_core.connect import ConnectOptions, connect, redact_url
from rebaser_core.durability import Durability, assess
from rebaser_core.errors import (
    InvalidSubject,
    ProtocolError,
    RebaserError,
    RebaserRefused,
    RebaserUnavailable,
)
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.monitoring import read_servers_sync
from rebaser_core.pauses import Pause
from rebaser_core.subjects import Subjects

if TYPE_CHECKING:
    # The wire models (pydantic) are imported where a request is decoded: `rebaser status` never needs them.
    from rebaser_core.api import EnqueueUpdatesRequest

__all__ = [
    "ADMIN_TIMEOUT",
    "ChangeSetLine",
    "ChangeSetReport",
    "PausedLine",
    "Progress",
    "QueuedRequest",
    "RecentReply",
    "RecordView",
    "StatusReport",
    "StreamSummary",
    "admin_connect",
    "change_set_report",
    "js_error",
    "no_progress",
    "parse_ids",
    "status_report",
    "task_state",
]

# Every JetStream call of an admin command answers within this long, or the command says NATS did not answer.
ADMIN_TIMEOUT = 5.0
# One quick connect attempt and one retry, as the other CLI commands do (docs/design.md §6).
_CONNECT_TIMEOUT = 2.0

Progress = Callable[[int, int], None]  # (done, total): long reads report how far they are


def no_progress(done: int, total: int) -> None:
    return None


def js_error(err: BaseException, subjects: Subjects) -> RebaserError:
    """The one line for a JetStream call that failed."""
    if isinstance(err, nats.errors.NoRespondersError | NotFoundError):
        # Direct gets of a stream that does not exist have no responders.
        return RebaserRefused(
            f"no rebaser deployment with prefix {subjects.prefix or '(none)'} here: its streams do not exist "
            "(is --prefix / REBASER_PREFIX right? has a daemon started?)"
        )
    return RebaserUnavailable(f"JetStream did not answer: {err or type(err).__name__}")


async def admin_connect(nats_url: str) -> NatsClient:
    """A connection for one admin command: fails in about a second with one line if NATS is unreachable."""
    errors: list[Exception] = []

    async def remember(err: Exception) -> None:
        errors.append(err)

    options = ConnectOptions(
        servers=(nats_url,),
        connect_timeout=_CONNECT_TIMEOUT,
        extra={"max_reconnect_attempts": 1, "reconnect_time_wait": 0.1, "error_cb": remember},
    )
    try:
        return await connect(options)
    except Exception as err:
        why = errors[-1] if errors else err
        raise RebaserUnavailable(
            f"cannot connect to NATS at {redact_url(nats_url)}: {why} "
            "(is the daemon running? --nats-url / REBASER_NATS_URL set the address)"
        ) from None


# -- streams -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamSummary:
    name: str
    messages: int | None  # None: the stream does not exist
    bytes: int = 0
    first_seq: int = 0
    last_seq: int = 0
    consumers: int = 0
    replicas: int = 0  # 0: the stream does not exist


@dataclass(frozen=True)
class ChangeSetLine:
    """One change set with something going on: requests queued, a task, or dead letters."""

    workspace_id: str
    change_set_id: str
    queued: int  # requests in the stream (including processed ones not yet purged)
    task: str  # "owned" (delivered to a daemon), "waiting" (for an owner) or "none"
    dead_letters: int
    owner: str | None = None  # from the record: the daemon that took it last
    epoch: int | None = None
    dvu_pending: bool | None = None


@dataclass(frozen=True)
class StatusReport:
    prefix: str | None
    streams: tuple[StreamSummary, ...]
    tasks_consumer: Mapping[str, int] | None  # pending, ack_pending, redelivered, waiting; None: missing
    records: int | None  # change-set records in the KV bucket
    change_sets: tuple[ChangeSetLine, ...]  # the busiest, at most ``limit``
    change_sets_total: int  # change sets with something going on, listed or not
    # What an acknowledged request survives, from the streams' replicas and the servers' sync setting as read from
    # their monitoring endpoints (rebaser_core.durability).
    durability: Durability | None = None
    # Paused change sets and workspaces (oldest pause first, at most ``limit``), with what is queued behind each.
    pauses: tuple[PausedLine, ...] = ()
    pauses_total: int = 0  # all of them, listed or not (at most MAX_LISTED_PAUSES are read: see pauses_more)
    pauses_more: bool = False  # there were more than MAX_LISTED_PAUSES: pauses_total counts only those
    # The busiest workspaces (_admin_workspaces: tasks and queued from the streams, owned from the daemons read).
    workspaces: tuple[WorkspaceLine, ...] = ()
    workspaces_total: int = 0
    daemons: DaemonsOwned = field(default_factory=lambda: DaemonsOwned({}, 0))
    # lease_mode daemon: the daemons' heartbeat keys (REBASER_DAEMONS); None: no such bucket (lease_mode task).
    heartbeats: int | None = None

    @property
    def owners(self) -> dict[str, int]:
        """Daemon -> change sets it owns (among those listed)."""
        counts: dict[str, int] = {}
        for line in self.change_sets:
            if line.task == "owned" and line.owner:
                counts[line.owner] = counts.get(line.owner, 0) + 1
        return counts


class _Reader:
    def __init__(self, nc: NatsClient, subjects: Subjects) -> None:
        self.nc = nc
        self.subjects = subjects
        self.js: JetStreamContext = nc.jetstream(timeout=ADMIN_TIMEOUT)

    async def subject_counts(self, stream: str, filter_: str) -> tuple[StreamSummary, dict[str, int]]:
        try:
            info = await self.js.stream_info(stream, subjects_filter=filter_)
        except NotFoundError:
            return StreamSummary(stream, None), {}
        state = info.state
        summary = StreamSummary(
            stream,
            state.messages,
            state.bytes,
            state.first_seq,
            state.last_seq,
            state.consumer_count,
            int(info.config.num_replicas or 1),
        )
        return summary, dict(state.subjects or {})

    async def record(self, workspace_id: str, change_set_id: str) -> RecordView | None:
        try:
            kv = await self.js.key_value(self.subjects.change_sets_bucket)
            entry = await kv.get(f"{workspace_id}.{change_set_id}")
        except (BucketNotFoundError, KeyNotFoundError):
            return None
        return None if not entry.value else RecordView.decode(entry.value)

    async def records(self) -> int | None:
        try:
            info = await self.js.stream_info(f"KV_{self.subjects.change_sets_bucket}")
        except NotFoundError:
            return None
        return int(info.state.messages)

    async def heartbeats(self) -> int | None:
        """The daemons' heartbeat keys (``lease_mode`` daemon); None if the deployment has no heartbeat bucket."""
        try:
            kv = await self.js.key_value(self.subjects.daemons_bucket)
        except BucketNotFoundError:
            return None
        try:
            return len(await kv.keys())
        except NoKeysError:
            return 0

    async def delivered_upto(self, consumer: str | None = None) -> int | None:
        """A tasks consumer's last delivered stream sequence (the shared one unless ``consumer`` is named): a task
        at or below it is held by a daemon. None if there is no such consumer."""
        try:
            info = await self.js.consumer_info(
                self.subjects.tasks_stream, consumer or self.subjects.tasks_consumer
            )
        except NotFoundError:
            return None
        return int(info.delivered.stream_seq or 0) if info.delivered else 0

    async def task_state(
        self, workspace_id: WorkspacePk, change_set_id: ChangeSetId, upto: int | None
    ) -> str:
        """``upto``: the shared tasks consumer's last delivered sequence (None: there is none, the fair intake: the
        workspace's own consumer is asked)."""
        try:
            msg = await self.js.get_last_msg(
                self.subjects.tasks_stream, self.subjects.task(workspace_id, change_set_id), direct=True
            )
        except NotFoundError:
            return "none"
        if upto is None:
            upto = await self.delivered_upto(self.subjects.workspace_tasks_consumer(workspace_id))
        return "owned" if upto is not None and (msg.seq or 0) <= upto else "waiting"


async def task_state(
    nc: NatsClient, subjects: Subjects, workspace_id: WorkspacePk, change_set_id: ChangeSetId
) -> str:
    """``owned`` (its task is delivered to a daemon), ``waiting`` (for an owner) or ``none``."""
    r = _Reader(nc, subjects)
    try:
        return await r.task_state(workspace_id, change_set_id, await r.delivered_upto())
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None


def parse_ids(subject: str, parse: Callable[[str], Any]) -> tuple[str, str] | None:
    try:
        parsed = parse(subject)
    except InvalidSubject:
        return None
    return str(parsed.workspace_id), str(parsed.change_set_id)


async def status_report(
    nc: NatsClient,
    subjects: Subjects,
    *,
    limit: int = 50,
    progress: Progress = no_progress,
    monitoring_urls: Sequence[str] = (),
    daemon_urls: Sequence[str] = (),
) -> StatusReport:
    """Streams, the tasks consumers, the ``limit`` busiest change sets (most requests queued first) and the busiest
    workspaces (owned change sets read from ``daemon_urls``, the daemons' health endpoints). With shards
    (rebaser_core.layout) every shard's streams are listed and the tasks consumers' figures summed."""
    r = _Reader(nc, subjects)
    summaries: list[StreamSummary] = []
    consumer: dict[str, int] | None = None
    upto: dict[int, int | None] = {}
    lines: dict[tuple[str, str], dict[str, int]] = {}
    try:
        layout = await fetch_layout(nc, subjects)
        for shard in range(1) if layout is None else layout.shards:
            names = subjects.for_shard(shard)
            requests, queued = await r.subject_counts(names.requests_stream, names.requests_all)
            tasks, task_subjects = await r.subject_counts(names.tasks_stream, names.tasks_all)
            summaries += [requests, tasks]
            try:
                c = await r.js.consumer_info(names.tasks_stream, names.tasks_consumer)
                figures = {
                    "pending": int(c.num_pending or 0),
                    "ack_pending": int(c.num_ack_pending or 0),
                    "redelivered": int(c.num_redelivered or 0),
                    "waiting_pulls": int(c.num_waiting or 0),
                }
                consumer = {k: v + (consumer or {}).get(k, 0) for k, v in figures.items()}
                upto[shard] = int(c.delivered.stream_seq or 0) if c.delivered else 0
            except NotFoundError:
                upto[shard] = None
            for counts, parse, key in (
                (queued, names.parse_requests, "queued"),
                (task_subjects, names.parse_task, "task"),
            ):
                for subject, count in counts.items():
                    ids = parse_ids(subject, parse)
                    if ids is not None:
                        line = lines.setdefault(ids, {})
                        line[key] = line.get(key, 0) + count
                        if key == "task":
                            line["shard"] = shard
        dlq, dead = await r.subject_counts(subjects.dead_letter_stream, subjects.dead_letters_all)
        summaries.append(dlq)
        records = await r.records()
        heartbeats = await r.heartbeats()
        paused, pauses_more = await all_pauses(r.js, subjects, timeout=ADMIN_TIMEOUT)
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    if all(s.messages is None for s in summaries):
        raise js_error(NotFoundError(), subjects)
    for subject, count in dead.items():
        ids = parse_ids(subject, _dead_letter_parser(subjects))
        if ids is not None:
            lines.setdefault(ids, {})["dead"] = count
    busiest = sorted(lines.items(), key=lambda kv: (-kv[1].get("queued", 0), -kv[1].get("dead", 0), kv[0]))
    chosen = busiest[:limit]
    out: list[ChangeSetLine] = []
    for done, ((wk, cs), counts) in enumerate(chosen, 1):
        record = await r.record(wk, cs)
        task = "none"
        if counts.get("task"):
            shard = counts.get("shard", 0)
            task = await _Reader(nc, subjects.for_shard(shard)).task_state(
                WorkspacePk(wk), ChangeSetId(cs), upto.get(shard)
            )
        out.append(
            ChangeSetLine(
                wk,
                cs,
                counts.get("queued", 0),
                task,
                counts.get("dead", 0),
                owner=record.owner if record else None,
                epoch=record.epoch if record else None,
                dvu_pending=record.dvu_pending if record else None,
            )
        )
        progress(done, len(chosen))
    servers, problems = await asyncio.to_thread(read_servers_sync, monitoring_urls)
    daemons = await asyncio.to_thread(read_daemons_owned, daemon_urls)
    workspaces, workspaces_total = busiest_workspaces(lines.items(), daemons)
    replicas = {s.name: s.replicas for s in summaries if s.messages is not None}
    durability = assess(servers, replicas, expected_servers=len(monitoring_urls), problems=problems)
    return StatusReport(
        subjects.prefix,
        tuple(summaries),
        consumer,
        records,
        tuple(out),
        len(lines),
        durability,
        pauses=tuple(_with_queued(p, lines) for p in paused[:limit]),
        pauses_total=len(paused),
        pauses_more=pauses_more,
        workspaces=workspaces,
        workspaces_total=workspaces_total,
        daemons=daemons,
        heartbeats=heartbeats,
    )


def _with_queued(line: PausedLine, lines: Mapping[tuple[str, str], Mapping[str, int]]) -> PausedLine:
    """``line`` with the requests queued behind it: its change set's, or every change set's of its workspace."""
    wk, cs = line.workspace_id, line.change_set_id
    if cs is not None:
        queued = lines.get((wk, cs), {}).get("queued", 0)
    else:
        queued = sum(counts.get("queued", 0) for (w, _), counts in lines.items() if w == wk)
    return PausedLine(wk, cs, line.pause, queued)


def _dead_letter_parser(subjects: Subjects) -> Callable[[str], Any]:
    def parse(subject: str) -> Any:
        # dlq.rebaser.requests.<wk>.<cs> parses like a request subject once the leading "dlq" token is dropped.
        tokens = subject.split(".")
        at = 1 if subjects.prefix else 0
        if len(tokens) <= at or tokens[at] != "dlq":
            raise InvalidSubject(subject)
        return subjects.parse_requests(".".join(tokens[:at] + tokens[at + 1 :]))

    return parse


# -- one change set ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QueuedRequest:
    seq: int
    request_id: str | None  # None: its id cannot be read (it will be dead-lettered)
    time: datetime | None  # when it was stored
    size: int
    summary: str  # what it asks for (or why it cannot be read)
    processed: bool  # at or below the record's watermark: done, waiting only to be purged
    attempts: int = 0  # retryable failures so far

    def age(self, now: datetime) -> float | None:
        return None if self.time is None else max(0.0, (now - self.time).total_seconds())


@dataclass(frozen=True)
class ChangeSetReport:
    workspace_id: str
    change_set_id: str
    record: RecordView | None
    task: str  # owned | waiting | none
    queued_total: int
    queued: tuple[QueuedRequest, ...]  # the first ``limit``, in order
    dead_letters: int
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    pause: Pause | None = None  # the change set's own pause
    workspace_pause: Pause | None = None  # its workspace's: it holds the change set too

    @property
    def paused(self) -> bool:
        return self.pause is not None or self.workspace_pause is not None


def _summary(request: EnqueueUpdatesRequest) -> str:
    from rebaser_core.api import InlineUpdates

    updates = request.updates
    what = (
        f"{len(updates.updates)} updates"
        if isinstance(updates, InlineUpdates)
        else f"stored batch {updates.address[:12]}"
    )
    if request.from_change_set_id is not None:
        what += f" from {request.from_change_set_id}"
    return what


def _queued(seq: int, msg: Any, record: RecordView | None) -> QueuedRequest:
    from rebaser_core.api import ENQUEUE_UPDATES_REQUEST

    headers = msg.headers or {}
    data = msg.data or b""
    try:
        request = ENQUEUE_UPDATES_REQUEST.decode(headers, data)
        rid: str | None = str(request.id)
        summary = _summary(request)
    except ProtocolError as err:
        rid = h.get_header(headers, h.NATS_MSG_ID)
        summary = f"unreadable: {type(err).__name__}: {str(err)[:120]}"
    attempts = record.attempts.get(rid or "", 0) if record else 0
    processed = record is not None and seq <= record.applied_seq
    return QueuedRequest(seq, rid, msg.time, len(data), summary, processed, attempts)


async def change_set_report(
    nc: NatsClient,
    subjects: Subjects,
    workspace_id: WorkspacePk,
    change_set_id: ChangeSetId,
    *,
    limit: int = 50,
    progress: Progress = no_progress,
) -> ChangeSetReport | None:
    """Everything about one change set; None if JetStream knows nothing of it (no record, nothing queued, no
    task, no dead letter)."""
    subjects = await routed(nc, subjects, workspace_id, change_set_id)  # the change set's shard
    r = _Reader(nc, subjects)
    subject = subjects.requests(workspace_id, change_set_id)
    try:
        record = await r.record(str(workspace_id), str(change_set_id))
        _, queued = await r.subject_counts(subjects.requests_stream, subject)
        _, dead = await r.subject_counts(
            subjects.dead_letter_stream, subjects.dead_letter(workspace_id, change_set_id)
        )
        task = await r.task_state(workspace_id, change_set_id, await r.delivered_upto())
        pause, workspace_pause = await pauses_of(r.js, subjects, workspace_id, change_set_id)
        total = queued.get(subject, 0)
        found: list[QueuedRequest] = []
        seq = 0
        while len(found) < min(limit, total):
            try:
                msg = await r.js.get_msg(
                    subjects.requests_stream, seq=seq + 1, subject=subject, next=True, direct=True
                )
            except NotFoundError:
                break
            seq = int(msg.seq or seq + 1)
            found.append(_queued(seq, msg, record))
            progress(len(found), min(limit, total))
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    dead_count = dead.get(subjects.dead_letter(workspace_id, change_set_id), 0)
    if record is None and not total and task == "none" and not dead_count and pause is None:
        return None
    return ChangeSetReport(
        str(workspace_id),
        str(change_set_id),
        record,
        task,
        total,
        tuple(found),
        dead_count,
        pause=pause,
        workspace_pause=workspace_pause,
    )
