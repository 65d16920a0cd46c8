"""Repairs of what the daemons keep in KV and read back: a change set's record, the cluster's layout entry.

Both are read as untrusted bytes, and either can hold garbage (a bug, or someone with write access to the bucket).
The daemons never guess past it; they stop and say which of these commands repairs it:

**``rebaser change-set reset-record WK CS``** (:func:`reset_record`): a daemon that finds a change set's record
unreadable quarantines it (pauses it, cause ``record_unreadable``: ``rebaser_server.changeset.quarantine``). The
reset deletes the record (compare-and-set on the revision read: a record a daemon rewrote meanwhile is left alone)
and resumes the change set if the quarantine (or an unreadable pause) is what holds it; an operator's own pause is
kept. The change set then starts over from the app's initial state, and its queued requests are applied in order.
What the record held is lost (it could not be read anyway): its state, and the watermark and recent replies that
make a redelivered request idempotent, so a processed request still in the stream (its removal failed) would be
applied again. Refused if the record reads.

**``rebaser streams repair``** (:func:`repair_layout`): a daemon that finds the layout entry unreadable waits
(``/readyz`` says why) rather than guess a layout. The repair writes a layout again: the last readable one in the
entry's history (the bucket keeps 5 revisions), if it agrees with the streams that exist; else one made from them:
as many shards as shard 0, 1, 2, ... have requests streams, the fifo intake if shard 0 has the shared tasks consumer
(else fair), the assignment mode given (else the last one read, else shared). Compare-and-set on the revision read;
refused if the entry reads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoKeysError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from rebaser_client._jetstream import jetstream, js_error
from rebaser_client._pause_read import pauses_of
from rebaser_client._pausing import ResumeResult, resume_change_set
from rebaser_client._record import RecordView
from rebaser_core.errors import DecodeError, LayoutMismatch, RebaserRefused
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.layout import LANES, MAX_STREAMS, AssignmentMode, Layout
from rebaser_core.nats.layout_store import open_layout
from rebaser_core.pauses import Pause
from rebaser_core.subjects import Subjects

__all__ = ["LayoutRepair", "RecordReset", "repair_layout", "reset_record"]

# The pauses that stand for damage: the quarantine of an unreadable record, and an unreadable pause entry.
_DAMAGE = ("record_unreadable", "unreadable")


@dataclass(frozen=True)
class RecordReset:
    workspace_id: str
    change_set_id: str
    found: str  # why the record did not read
    resumed: ResumeResult | None  # the quarantine lifted (None: an operator's pause still holds it)
    still_paused: Pause | None  # that pause


async def reset_record(
    nc: NatsClient, subjects: Subjects, workspace_id: WorkspacePk, change_set_id: ChangeSetId
) -> RecordReset:
    """Delete the change set's unreadable record and lift its quarantine (see the module docstring).
    :class:`RebaserRefused` (nothing done) if it has no record or its record reads."""
    wk, cs = workspace_id, change_set_id
    key = Subjects.change_set_key(wk, cs)
    js = jetstream(nc)
    try:
        try:
            kv = await js.key_value(subjects.change_sets_bucket)
            entry = await kv.get(key)  # a deleted record raises KeyDeletedError, a KeyNotFoundError
        except (BucketNotFoundError, KeyNotFoundError):
            raise RebaserRefused(f"change set {wk}/{cs} has no record: nothing to reset") from None
        try:
            RecordView.decode(entry.value or b"")
        except DecodeError as err:
            found = str(err)
        else:
            raise RebaserRefused(f"the record of {wk}/{cs} reads: nothing to repair (it is not reset)")
        try:
            await kv.delete(key, last=entry.revision)
        except KeyWrongLastSequenceError:
            raise RebaserRefused(
                f"the record of {wk}/{cs} changed while this command looked at it; look again"
            ) from None
        own, _ = await pauses_of(js, subjects, wk, cs)
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    if own is not None and own.cause not in _DAMAGE:
        return RecordReset(str(wk), str(cs), found, None, own)
    # Not paused (the record turned unreadable while no daemon had read it yet): the task all the same.
    return RecordReset(str(wk), str(cs), found, await resume_change_set(nc, subjects, wk, cs), None)


@dataclass(frozen=True)
class LayoutRepair:
    layout: Layout  # as written now
    found: str  # why the entry did not read
    source: str  # "history": the last readable layout; "streams": made from the streams that exist


async def repair_layout(
    nc: NatsClient, subjects: Subjects, *, assignment: AssignmentMode | None = None
) -> LayoutRepair:
    """Write the cluster's unreadable layout entry again (see the module docstring). :class:`RebaserRefused`
    (nothing done) if it reads, or if there is no deployment."""
    js = jetstream(nc)
    try:
        kv = await open_layout(js, subjects)
        if kv is None:
            raise RebaserRefused(f"no layout bucket {subjects.layout_bucket}: has a daemon started here?")
        try:
            entry = await kv.get(subjects.layout_key)
        except KeyNotFoundError:
            raise RebaserRefused(
                "there is no layout entry (a daemon writes it at start-up): nothing to repair"
            ) from None
        try:
            Layout.decode(entry.value or b"")
        except LayoutMismatch as err:
            found = str(err)
        else:
            raise RebaserRefused(
                "the layout entry reads: nothing to repair (`rebaser streams show` shows it)"
            )
        last = await _last_readable(kv, subjects.layout_key)
        streams = await _shards_found(js, subjects)
        if streams == 0:
            raise RebaserRefused(
                f"no requests stream {subjects.requests_stream}: no deployment to repair here"
            )
        if last is not None and len(last.shards) == streams and assignment in (None, last.mode):
            layout, source = replace(last, epoch=last.epoch + 1), "history"
        else:
            fifo = await _has_consumer(js, subjects.tasks_stream, subjects.tasks_consumer)
            lanes = await _has_consumer(js, subjects.tasks_stream, subjects.lane_consumer(0))
            transform = (await js.stream_info(subjects.tasks_stream)).config.subject_transform
            layout = Layout(
                streams=streams,
                mode=assignment or (last.mode if last is not None else "shared"),
                epoch=(last.epoch if last is not None else 0) + 1,
                intake="fifo" if fifo else "lanes" if lanes else "fair",
                lane_count=(transform and subjects.transform_lanes(transform.dest or "")) or LANES,
            )
            source = "streams"
        try:
            await kv.update(subjects.layout_key, layout.encode(), last=entry.revision)
        except KeyWrongLastSequenceError:
            raise RebaserRefused(
                "the layout entry changed while this command looked at it; look again"
            ) from None
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    return LayoutRepair(layout, found, source)


async def _last_readable(kv: KeyValue, key: str) -> Layout | None:
    """The newest revision of the entry that reads as a layout (the bucket keeps a few), if any."""
    try:
        entries = await kv.history(key)
    except (NotFoundError, KeyNotFoundError, NoKeysError):
        return None
    for entry in reversed(entries):
        try:
            return Layout.decode(entry.value or b"")
        except LayoutMismatch:
            continue
    return None


async def _shards_found(js: JetStreamContext, subjects: Subjects) -> int:
    """How many shards have a requests stream, counting 0, 1, 2, ... up to the first that has none."""
    for shard in range(MAX_STREAMS):
        try:
            await js.stream_info(subjects.for_shard(shard).requests_stream)
        except NotFoundError:
            return shard
    return MAX_STREAMS


async def _has_consumer(js: JetStreamContext, stream: str, consumer: str) -> bool:
    try:
        await js.consumer_info(stream, consumer)
    except NotFoundError:
        return False
    return True
