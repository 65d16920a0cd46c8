"""Pausing and resuming a change set or a whole workspace: ``RebaserClient.pause_change_set`` and its kin, and
``rebaser change-set|workspace pause|resume`` (skipping a paused change set's first request is
:mod:`rebaser_client._skipping`).

A pause is a key of the ``REBASER_PAUSES`` bucket (:mod:`rebaser_core.pauses`); the daemons watch it. A paused change
set is let go by its owner at its next request boundary, and a daemon that takes a paused change set's task acks it
and does nothing; its requests are still accepted and stored meanwhile.

- **Pause** stores ``Pause.now("operator", reason)``. Pausing what is paused already keeps the first pause (its
  cause, reason and ``since``) and says so. With ``wait``, returns once no daemon holds the change set (its task is
  not delivered to one): :class:`~rebaser_core.errors.StillHeld` if one still does after ``wait`` seconds (it stays
  paused).
- **Resume** deletes the key, then gives a task to the change set (to every change set of the workspace) that has
  requests queued, so a daemon takes it again. Resuming what is not paused does the same and is not an error. A
  change set stays paused while its workspace is (and a workspace's change sets paused on their own stay so).

Every JetStream call has a deadline (``OPERATOR_TIMEOUT``); NATS trouble is :class:`RebaserUnavailable`, a
deployment that does not exist :class:`RebaserRefused` (:func:`rebaser_client._jetstream.js_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import StorageType
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from rebaser_client._jetstream import (
    OPERATOR_TIMEOUT,
    jetstream,
    js_error,
    parse_ids,
    read_layout,
    shard_now,
    shards_of,
    task_state,
)
from rebaser_client._pause_read import PausedLine, all_pauses, pauses_of, read_pause
from rebaser_client._record import read_record
from rebaser_core import headers as h
from rebaser_core.api import CHANGE_SET_EVENT, ChangeSetEvent, EventKind
from rebaser_core.errors import DecodeError, RebaserUnavailable, StillHeld
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.layout import Layout
from rebaser_core.nats.listing import stream_subjects
from rebaser_core.nats.pause_store import open_pauses
from rebaser_core.nats.tasks import publish_task
from rebaser_core.pauses import Pause, change_set_key, workspace_key
from rebaser_core.subjects import Subjects

__all__ = [
    "RESUME_BOUND",
    "PauseResult",
    "ResumeResult",
    "list_pauses",
    "pause_change_set",
    "pause_of",
    "pause_workspace",
    "resume_change_set",
    "resume_workspace",
]

# A workspace's resume gives a task to at most this many of its change sets (and a workspace pause's wait watches at
# most this many tasks). The rest get theirs from the daemons' orphan sweep (every ``sweep_interval``, 30 s by
# default), which gives a task to every change set with requests queued and none, unless it is paused.
RESUME_BOUND = 10_000
_POLL = 0.1
_PUBLISH_AT_ONCE = 64


@dataclass(frozen=True)
class PauseResult:
    """What a pause did: the pause in effect, and whether the change set (or workspace) was paused already."""

    workspace_id: str
    change_set_id: str | None  # None: the whole workspace
    pause: Pause  # the pause in effect: the one stored now, or the first one if it was paused already
    already: bool  # it was paused already: the first pause is kept
    let_go: bool | None  # with a wait: no daemon holds it any more; None: not waited for


@dataclass(frozen=True)
class ResumeResult:
    """What a resume did: the pause removed, and the change sets given a task to be taken again."""

    workspace_id: str
    change_set_id: str | None  # None: the whole workspace
    was: Pause | None  # the pause removed; None: it was not paused
    queued: int  # change sets with requests queued (one at most for a change set)
    tasks_published: int  # of those, given a task now
    tasks_existing: int  # of those, that had one already
    left_to_sweep: int = 0  # over RESUME_BOUND: given their task by the daemons' orphan sweep
    # For a change set: its workspace's pause, which still holds it. For a workspace: its change sets paused on their
    # own, which stay paused.
    workspace_pause: Pause | None = None
    still_paused: int = 0


# -- helpers ---------------------------------------------------------------------------------------------------------
def _workspace_filter(pattern: str, workspace_id: WorkspacePk) -> str:
    """A shard's ``…requests[.<k>].*.*`` (or tasks) filter narrowed to one workspace: ``…<wk>.*``."""
    return pattern.replace("*", str(workspace_id), 1)


async def _bucket(js: JetStreamContext, subjects: Subjects) -> KeyValue:
    """The pauses bucket, created with the deployment's replicas and storage (those of its requests stream) if no
    daemon has created it yet."""
    kv = await open_pauses(js, subjects, create=False)
    if kv is not None:
        return kv
    # NotFoundError if there is none: no deployment here (js_error says so).
    info = await js.stream_info(subjects.requests_stream)
    storage = "memory" if info.config.storage == StorageType.MEMORY else "file"
    replicas = int(info.config.num_replicas or 1)
    kv = await open_pauses(js, subjects, create=True, replicas=replicas, storage=storage)
    assert kv is not None
    return kv


async def _store(kv: KeyValue, key: str, pause: Pause) -> tuple[Pause, bool]:
    """(the pause in effect, whether it was there already). Never overwrites a pause: the first one is kept."""
    for _ in range(3):
        try:
            await kv.create(key, pause.encode())
            return pause, False
        except KeyWrongLastSequenceError:
            existing = await read_pause(kv, key)
        if existing is not None and existing.cause != "unreadable":
            return existing, True
        try:  # not a pause (it holds all the same: fail closed) or deleted meanwhile: overwrite what is there now
            entry = await kv.get(key)
            await kv.update(key, pause.encode(), last=entry.revision)
            return pause, False
        except (KeyNotFoundError, KeyWrongLastSequenceError):
            continue  # deleted or rewritten meanwhile: look again
    raise RebaserUnavailable(f"the pause {key} keeps changing under this command: try again")


async def _wait_let_go(
    nc: NatsClient,
    subjects: Subjects,
    targets: list[tuple[WorkspacePk, ChangeSetId]],
    layout: Layout | None,
    wait: float,
    what: str,
) -> None:
    """Return once none of ``targets`` has its task delivered to a daemon; :class:`StillHeld` after ``wait``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    pending = list(targets)
    while True:
        still = []
        for wk, cs in pending:
            if await task_state(nc, shard_now(subjects, layout, wk, cs), wk, cs) == "owned":
                still.append((wk, cs))
        pending = still
        if not pending:
            return
        left = deadline - loop.time()
        if left <= 0:
            held = f"{pending[0][0]}/{pending[0][1]}" + (
                f" and {len(pending) - 1} more" if len(pending) > 1 else ""
            )
            raise StillHeld(
                f"{what} is paused, but after {wait:g}s a daemon still holds {held}: it is being let go (at its "
                "next request boundary); see `rebaser change-set show`"
            )
        await asyncio.sleep(min(_POLL, left))


async def _has_queued(
    js: JetStreamContext, shards: Iterable[Subjects], wk: WorkspacePk, cs: ChangeSetId
) -> bool:
    for names in shards:
        try:
            # From the stream leader (STREAM.MSG.GET), not a direct get: any replica answers one, and one that lags
            # would say nothing is queued, leaving the requests to the orphan sweep.
            await js.get_last_msg(names.requests_stream, names.requests(wk, cs), direct=False)
            return True
        except NotFoundError:
            continue
    return False


async def _give_tasks(
    nc: NatsClient, subjects: Subjects, layout: Layout | None, targets: list[tuple[WorkspacePk, ChangeSetId]]
) -> int:
    """Publish each change set's task (in its current shard); how many were created (the others had one)."""
    created = 0
    for at in range(0, len(targets), _PUBLISH_AT_ONCE):
        batch = targets[at : at + _PUBLISH_AT_ONCE]
        subjects_of = [shard_now(subjects, layout, wk, cs).task(wk, cs) for wk, cs in batch]
        results = await asyncio.gather(*(publish_task(nc, s, timeout=OPERATOR_TIMEOUT) for s in subjects_of))
        created += sum(results)
    return created


async def _tell_followers(
    nc: NatsClient, subjects: Subjects, wk: WorkspacePk, cs: ChangeSetId, kind: EventKind, reason: str
) -> None:
    """With the event feed on (its stream exists): a ``paused`` or ``resumed`` notice for the change set's
    followers, after the last durable event its record counts. Best effort: the pause itself is what counts."""
    js = jetstream(nc)
    try:
        await js.stream_info(subjects.events_stream)
    except NotFoundError:
        return  # the feed is off
    except (TimeoutError, nats.errors.Error):
        return
    try:
        record = await read_record(js, subjects, wk, cs)
    except (TimeoutError, nats.errors.Error, DecodeError):
        return
    event = ChangeSetEvent(
        id=RequestId.new(),
        workspace_id=wk,
        change_set_id=cs,
        kind=kind,
        seq=0 if record is None else record.events,
        durable=False,
        at=time.time(),
        owner="operator",
        reason=reason[:128] or None,
    )
    headers, body = CHANGE_SET_EVENT.encode(event)
    headers.pop(h.NATS_MSG_ID, None)  # a notice carries none (docs/protocol.md §17)
    with contextlib.suppress(TimeoutError, nats.errors.Error):
        await js.publish(subjects.events(wk, cs), body, headers=headers, timeout=OPERATOR_TIMEOUT)


def _name(wk: object, cs: object | None) -> str:
    return f"workspace {wk}" if cs is None else f"change set {wk}/{cs}"


# -- reading ---------------------------------------------------------------------------------------------------------
async def pause_of(
    nc: NatsClient, subjects: Subjects, workspace_id: WorkspacePk, change_set_id: ChangeSetId
) -> tuple[Pause | None, Pause | None]:
    """(the change set's own pause, its workspace's pause); None where there is none. Either one holds it."""
    try:
        return await pauses_of(jetstream(nc), subjects, workspace_id, change_set_id)
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None


async def list_pauses(nc: NatsClient, subjects: Subjects) -> list[PausedLine]:
    """Every paused change set and workspace, oldest pause first (at most ``MAX_LISTED_PAUSES``; ``queued`` is not
    counted here: ``status_report`` does)."""
    try:
        found, _ = await all_pauses(jetstream(nc), subjects, timeout=OPERATOR_TIMEOUT)
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    return found


# -- pause -----------------------------------------------------------------------------------------------------------
async def pause_change_set(
    nc: NatsClient,
    subjects: Subjects,
    workspace_id: WorkspacePk,
    change_set_id: ChangeSetId,
    reason: str = "",
    *,
    wait: float | None = None,
    by: str | None = None,
) -> PauseResult:
    """Pause a change set (see the module docstring). ``wait``: seconds to wait for its owner to let it go; ``by``:
    who asks, stored with the pause (the web console names its caller)."""
    wk, cs = workspace_id, change_set_id
    try:
        kv = await _bucket(jetstream(nc), subjects)
        pause, already = await _store(kv, change_set_key(wk, cs), Pause.now("operator", reason, by=by))
        layout = await read_layout(nc, subjects) if wait is not None else None
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    if not already:
        await _tell_followers(nc, subjects, wk, cs, "paused", reason)
    if wait is not None:
        await _wait_let_go(nc, subjects, [(wk, cs)], layout, wait, _name(wk, cs))
    return PauseResult(str(wk), str(cs), pause, already, None if wait is None else True)


async def pause_workspace(
    nc: NatsClient,
    subjects: Subjects,
    workspace_id: WorkspacePk,
    reason: str = "",
    *,
    wait: float | None = None,
    by: str | None = None,
) -> PauseResult:
    """Pause every change set of a workspace, those created later too. ``wait``: seconds to wait until no daemon
    holds any of them (those with a task: at most ``RESUME_BOUND`` are watched); ``by``: who asks."""
    wk = workspace_id
    try:
        kv = await _bucket(jetstream(nc), subjects)
        pause, already = await _store(kv, workspace_key(wk), Pause.now("operator", reason, by=by))
        layout = await read_layout(nc, subjects) if wait is not None else None
        targets = await _with_tasks(nc, subjects, layout, wk) if wait is not None else []
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    if wait is not None:
        await _wait_let_go(nc, subjects, targets, layout, wait, _name(wk, None))
    return PauseResult(str(wk), None, pause, already, None if wait is None else True)


async def _subjects_of_workspace(
    js: JetStreamContext, stream: str, filter_: str, parse: Callable[[str], Any]
) -> dict[tuple[str, str], int]:
    try:
        listed = await stream_subjects(js, stream, filter_)
    except NotFoundError:  # a shard whose streams are not created yet (or deleted): nothing there
        return {}
    found: dict[tuple[str, str], int] = {}
    for subject, count in listed.items():
        ids = parse_ids(subject, parse)
        if ids is not None and count:
            found[ids] = found.get(ids, 0) + count
    return found


async def _with_tasks(
    nc: NatsClient, subjects: Subjects, layout: Layout | None, wk: WorkspacePk
) -> list[tuple[WorkspacePk, ChangeSetId]]:
    """The workspace's change sets that have a task (in any shard), at most RESUME_BOUND."""
    js = jetstream(nc)
    found: set[tuple[str, str]] = set()
    for shard in range(1) if layout is None else layout.shards:
        names = subjects.for_shard(shard)
        found |= (
            await _subjects_of_workspace(
                js, names.tasks_stream, names.stored_tasks_of_workspace(wk), names.parse_task
            )
        ).keys()
    return [(WorkspacePk(w), ChangeSetId(c)) for w, c in sorted(found)[:RESUME_BOUND]]


# -- resume ----------------------------------------------------------------------------------------------------------
async def resume_change_set(
    nc: NatsClient, subjects: Subjects, workspace_id: WorkspacePk, change_set_id: ChangeSetId
) -> ResumeResult:
    """Remove the change set's pause, then give it a task if it has requests queued."""
    wk, cs = workspace_id, change_set_id
    js = jetstream(nc)
    try:
        kv = await open_pauses(js, subjects, create=False)
        was = None
        workspace_pause = None
        if kv is not None:
            key = change_set_key(wk, cs)
            was = await read_pause(kv, key)
            await kv.delete(key)
            workspace_pause = await read_pause(kv, workspace_key(wk))
        layout = await read_layout(nc, subjects)
        # After the delete: a daemon that takes the task now sees no pause (or the workspace's).
        queued = await _has_queued(js, shards_of(subjects, layout, wk, cs), wk, cs)
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    if was is not None:
        await _tell_followers(nc, subjects, wk, cs, "resumed", was.reason)
    created = await _give_tasks(nc, subjects, layout, [(wk, cs)]) if queued else 0
    return ResumeResult(
        str(wk),
        str(cs),
        was,
        int(queued),
        created,
        int(queued) - created,
        workspace_pause=workspace_pause,
    )


async def resume_workspace(nc: NatsClient, subjects: Subjects, workspace_id: WorkspacePk) -> ResumeResult:
    """Remove the workspace's pause, then give a task to each of its change sets that has requests queued in any
    shard and is not paused on its own: at most ``RESUME_BOUND`` of them (in id order); the others get theirs from
    the daemons' orphan sweep (``left_to_sweep`` says how many)."""
    wk = workspace_id
    js = jetstream(nc)
    try:
        kv = await open_pauses(js, subjects, create=False)
        was = None
        own: set[str] = set()
        if kv is not None:
            key = workspace_key(wk)
            was = await read_pause(kv, key)
            await kv.delete(key)
            # Read after the delete: a change set resumed meanwhile is either seen resumed here, or gets its task from
            # its own resume (which publishes after its delete, when the workspace is no longer paused).
            paused, _ = await all_pauses(js, subjects, timeout=OPERATOR_TIMEOUT)
            own = {
                p.change_set_id for p in paused if p.workspace_id == str(wk) and p.change_set_id is not None
            }
        layout = await read_layout(nc, subjects)
        queued: set[tuple[str, str]] = set()
        for shard in range(1) if layout is None else layout.shards:
            names = subjects.for_shard(shard)
            queued |= (
                await _subjects_of_workspace(
                    js,
                    names.requests_stream,
                    _workspace_filter(names.requests_stream_subject, wk),
                    names.parse_requests,
                )
            ).keys()
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    ready = sorted((w, c) for w, c in queued if c not in own)
    chosen = [(WorkspacePk(w), ChangeSetId(c)) for w, c in ready[:RESUME_BOUND]]
    created = await _give_tasks(nc, subjects, layout, chosen)
    return ResumeResult(
        str(wk),
        None,
        was,
        len(ready),
        created,
        len(chosen) - created,
        left_to_sweep=len(ready) - len(chosen),
        still_paused=len(own),
    )
