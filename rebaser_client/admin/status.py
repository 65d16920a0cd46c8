"""``rebaser status``: one deployment at a glance. Its streams (every shard's), the tasks consumers, the busiest
change sets and workspaces, the pauses, the dead letters, the daemons' heartbeats and what an acknowledged request
survives.

Read-only, through :class:`~rebaser_client.admin.reader.Reader`; the busiest workspaces come from
:mod:`~rebaser_client.admin.workspaces`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from rebaser_client._jetstream import OPERATOR_TIMEOUT, js_error, parse_ids
from rebaser_client._pause_read import PausedLine, all_pauses
from rebaser_client._routing import fetch_layout
from rebaser_client.admin.reader import Progress, Reader, StreamSummary, no_progress
from rebaser_client.admin.workspaces import (
    WORKSPACES_LISTED,
    DaemonsOwned,
    WorkspaceLine,
    busiest_workspaces,
    read_daemons_owned,
)
from rebaser_core.errors import DecodeError, InvalidSubject
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.layout import Layout
from rebaser_core.nats.durability import Durability, assess
from rebaser_core.nats.layout_store import open_layout, read_durability
from rebaser_core.nats.monitoring import read_servers_sync
from rebaser_core.nats.shard_info import tasks_consumer_info
from rebaser_core.subjects import Subjects

__all__ = ["ChangeSetLine", "Counts", "StatusReport", "read_counts", "status_report"]


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
    # their monitoring endpoints (rebaser_core.nats.durability).
    durability: Durability | None = None
    # Paused change sets and workspaces (oldest pause first, at most ``limit``), with what is queued behind each.
    pauses: tuple[PausedLine, ...] = ()
    pauses_total: int = 0  # all of them, listed or not (at most MAX_LISTED_PAUSES are read: see pauses_more)
    pauses_more: bool = False  # there were more than MAX_LISTED_PAUSES: pauses_total counts only those
    # The busiest workspaces (admin.workspaces: tasks and queued from the streams, owned from the daemons read).
    workspaces: tuple[WorkspaceLine, ...] = ()
    workspaces_total: int = 0
    daemons: DaemonsOwned = field(default_factory=lambda: DaemonsOwned({}, 0))
    # lease_mode daemon: the daemons' heartbeat keys (REBASER_DAEMONS); None: no such bucket (lease_mode task).
    heartbeats: int | None = None
    # Given no monitoring URL: the durability is a daemon's finding (rebaser_core.nats.layout_store),
    # "<daemon> at <time>".
    durability_from: str | None = None

    # Daemon -> change sets it owns, over every change set with a task, listed or not (status_report counts them
    # all, whatever ``limit``); None: not counted (then :attr:`owners` counts those listed).
    owners_counted: Mapping[str, int] | None = None

    @property
    def owners(self) -> dict[str, int]:
        """Daemon -> change sets it owns: the true totals when :attr:`owners_counted` is known, else among those
        listed."""
        if self.owners_counted is not None:
            return dict(self.owners_counted)
        counts: dict[str, int] = {}
        for line in self.change_sets:
            if line.task == "owned" and line.owner:
                counts[line.owner] = counts.get(line.owner, 0) + 1
        return counts


@dataclass(frozen=True)
class Counts:
    """What the streams' subject counts say, every shard's: one stream info per stream and shard, no call per change
    set. ``rebaser status`` reads them once; the web console every second, for its live list."""

    summaries: tuple[StreamSummary, ...]  # each shard's requests and tasks streams, then the dead letters'
    consumer: Mapping[str, int] | None  # the shared tasks consumers' figures, summed; None: there is none
    upto: Mapping[
        int, int | None
    ]  # shard -> its shared tasks consumer's last delivered sequence (None: none)
    # (workspace, change set) -> {"queued": requests stored, "task": tasks, "shard": the task's shard, "dead": ...}
    lines: Mapping[tuple[str, str], Mapping[str, int]]
    records: int | None  # change-set records in the KV bucket
    heartbeats: int | None
    shards: tuple[int, ...] = (0,)
    layout: Layout | None = None  # None: one shard, no layout stored


async def read_counts(nc: NatsClient, subjects: Subjects) -> Counts:
    """The deployment's streams and what each change set has in them (:class:`Counts`); one line if NATS fails,
    :class:`~rebaser_core.errors.RebaserRefused` if there is no deployment."""
    r = Reader(nc, subjects)
    summaries: list[StreamSummary] = []
    consumer: dict[str, int] | None = None
    upto: dict[int, int | None] = {}
    lines: dict[tuple[str, str], dict[str, int]] = {}
    try:
        layout = await fetch_layout(nc, subjects)
        shards = tuple(range(1) if layout is None else layout.shards)
        for shard in shards:
            names = subjects.for_shard(shard)
            requests, queued = await r.subject_counts(names.requests_stream, names.requests_all)
            tasks, task_subjects = await r.subject_counts(names.tasks_stream, names.tasks_all)
            summaries += [requests, tasks]
            try:
                lanes = layout is not None and layout.lane_consumers
                read = tasks_consumer_info(r.js, names, layout)
                if read is None:
                    raise NotFoundError
                c = await read
                figures = {
                    "pending": int(c.num_pending or 0),
                    "ack_pending": int(c.num_ack_pending or 0),
                    "redelivered": int(c.num_redelivered or 0),
                    "waiting_pulls": int(c.num_waiting or 0),
                }
                consumer = {k: v + (consumer or {}).get(k, 0) for k, v in figures.items()}
                # The lanes have no one delivered sequence: each task is compared with its own lane's (None).
                upto[shard] = None if lanes else int(c.delivered.stream_seq or 0) if c.delivered else 0
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
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    if all(s.messages is None for s in summaries):
        raise js_error(NotFoundError(), subjects)
    for subject, count in dead.items():
        ids = parse_ids(subject, _dead_letter_parser(subjects))
        if ids is not None:
            lines.setdefault(ids, {})["dead"] = count
    return Counts(tuple(summaries), consumer, upto, lines, records, heartbeats, shards, layout)


async def status_report(
    nc: NatsClient,
    subjects: Subjects,
    *,
    limit: int = 50,
    progress: Progress = no_progress,
    monitoring_urls: Sequence[str] = (),
    daemon_urls: Sequence[str] = (),
    counts: Counts | None = None,
    workspaces_limit: int = WORKSPACES_LISTED,
    pauses: tuple[list[PausedLine], bool] | None = None,
    daemons: DaemonsOwned | None = None,
    count_owners: bool = True,
) -> StatusReport:
    """Streams, the tasks consumers, the ``limit`` busiest change sets (most requests queued first) and the
    ``workspaces_limit`` busiest workspaces (owned change sets read from ``daemon_urls``, the daemons' health
    endpoints). With shards (rebaser_core.layout) every shard's streams are listed and the tasks consumers' figures
    summed. ``counts``: the subject counts read already (:func:`read_counts`), not read again; ``pauses``: every
    pause and whether there were more (:func:`~rebaser_client._pause_read.all_pauses`), known already (the web
    console watches them); ``daemons``: the daemons' health, read already. ``count_owners``: count the change sets
    each daemon owns over every change set with a task, not only the ``limit`` listed (a record and a task read
    for each one not listed, :data:`_OWNER_READS` at a time)."""
    if counts is None:
        counts = await read_counts(nc, subjects)
    summaries, upto, lines = counts.summaries, counts.upto, counts.lines
    r = Reader(nc, subjects)
    try:
        paused, pauses_more = pauses or await all_pauses(r.js, subjects, timeout=OPERATOR_TIMEOUT)
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    busiest = sorted(lines.items(), key=lambda kv: (-kv[1].get("queued", 0), -kv[1].get("dead", 0), kv[0]))
    chosen = busiest[:limit]
    out: list[ChangeSetLine] = []
    for done, ((wk, cs), figures) in enumerate(chosen, 1):
        try:
            record = await r.record(wk, cs)
        except DecodeError:  # garbage: quarantined, and its pause (listed below) names the repair
            record = None
        task = "none"
        if figures.get("task"):
            shard = figures.get("shard", 0)
            task = await Reader(nc, subjects.for_shard(shard)).task_state(
                WorkspacePk(wk), ChangeSetId(cs), upto.get(shard)
            )
        out.append(
            ChangeSetLine(
                wk,
                cs,
                figures.get("queued", 0),
                task,
                figures.get("dead", 0),
                owner=record.owner if record else None,
                epoch=record.epoch if record else None,
                dvu_pending=record.dvu_pending if record else None,
            )
        )
        progress(done, len(chosen))
    owners = await _count_owners(nc, subjects, lines, upto, out) if count_owners else None
    servers, problems = await asyncio.to_thread(read_servers_sync, monitoring_urls)
    if daemons is None:  # not read already (the web console reads them on their own)
        daemons = await asyncio.to_thread(read_daemons_owned, daemon_urls)
    workspaces, workspaces_total = busiest_workspaces(lines.items(), daemons, limit=workspaces_limit)
    replicas = {s.name: s.replicas for s in summaries if s.messages is not None}
    durability = assess(servers, replicas, expected_servers=len(monitoring_urls), problems=problems)
    durability_from = None
    if not monitoring_urls:
        # The daemons read the servers' monitoring endpoints; this command was given none: what they found.
        noted = await _noted_durability(nc, subjects)
        if noted is not None:
            durability, by, at = noted
            durability_from = f"{by} at {at}"
    return StatusReport(
        subjects.prefix,
        summaries,
        counts.consumer,
        counts.records,
        tuple(out),
        len(lines),
        durability,
        pauses=tuple(_with_queued(p, lines) for p in paused[:limit]),
        pauses_total=len(paused),
        pauses_more=pauses_more,
        workspaces=workspaces,
        workspaces_total=workspaces_total,
        daemons=daemons,
        heartbeats=counts.heartbeats,
        durability_from=durability_from,
        owners_counted=owners,
    )


_OWNER_READS = 32  # reads at a time when counting the owners of the change sets not listed


async def _count_owners(
    nc: NatsClient,
    subjects: Subjects,
    lines: Mapping[tuple[str, str], Mapping[str, int]],
    upto: Mapping[int, int | None],
    listed: Sequence[ChangeSetLine],
) -> dict[str, int]:
    """Daemon -> change sets it owns, over every change set with a task: those listed as read already, the others
    read here (its task's state, then its record's owner if it is owned)."""
    counts: dict[str, int] = {}
    seen = set()
    for line in listed:
        seen.add((line.workspace_id, line.change_set_id))
        if line.task == "owned" and line.owner:
            counts[line.owner] = counts.get(line.owner, 0) + 1
    rest = [(key, f) for key, f in lines.items() if f.get("task") and key not in seen]
    gate = asyncio.Semaphore(_OWNER_READS)
    r = Reader(nc, subjects)

    async def owner_of(key: tuple[str, str], figures: Mapping[str, int]) -> str | None:
        async with gate:
            shard = figures.get("shard", 0)
            task = await Reader(nc, subjects.for_shard(shard)).task_state(
                WorkspacePk(key[0]), ChangeSetId(key[1]), upto.get(shard)
            )
            if task != "owned":
                return None
            try:
                record = await r.record(*key)
            except DecodeError:
                return None
            return record.owner if record is not None and record.owner else None

    try:
        found = await asyncio.gather(*(owner_of(key, f) for key, f in rest))
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    for owner in found:
        if owner:
            counts[owner] = counts.get(owner, 0) + 1
    return counts


async def _noted_durability(nc: NatsClient, subjects: Subjects) -> tuple[Durability, str, str] | None:
    with contextlib.suppress(
        Exception
    ):  # an older deployment, a bucket not readable: the command's own reading
        kv = await open_layout(nc.jetstream(), subjects)
        return None if kv is None else await read_durability(kv)
    return None


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
