"""Skipping the first request of a paused change set: ``RebaserClient.skip_request`` and ``rebaser change-set
skip``.

Only while the change set is paused and no daemon holds it (:mod:`rebaser_client._pausing`), and only the first
queued request not yet processed: it is copied to the dead-letter stream, reason ``skipped by an operator``, whole
(so ``rebaser dlq replay`` can send it again), then deleted from the requests stream. The copy is deduplicated by
the request's stream sequence: a skip that failed after its copy and is run again stores no second one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import APIError, NotFoundError

from rebaser_client._jetstream import (
    OPERATOR_TIMEOUT,
    jetstream,
    js_error,
    read_layout,
    shards_of,
    task_state,
)
from rebaser_client._pause_read import pauses_of
from rebaser_client._record import RecordView, read_record
from rebaser_core import headers as h
from rebaser_core.dead_letter_copy import bounded_copy, dead_letter_marks, dead_letter_subject
from rebaser_core.errors import (
    HeldByDaemon,
    NotFirstInLine,
    NotPaused,
    ProtocolError,
    RebaserRefused,
    RebaserUnavailable,
)
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.tasks import check_pub_ack
from rebaser_core.subjects import Subjects

__all__ = ["SKIP_REASON", "SkipResult", "SkipTarget", "check_skip", "skip_request"]

SKIP_REASON = "skipped by an operator"
# nats-server's answer to deleting a sequence that holds no message.
_NO_MESSAGE = 10057


@dataclass(frozen=True)
class SkipResult:
    """Where the skipped request was, and where its copy is now."""

    workspace_id: str
    change_set_id: str
    request_id: str
    seq: int  # its sequence in the requests stream
    stream: str
    dead_letter_seq: int  # the copy's sequence in the dead-letter stream
    duplicate: bool  # the copy was stored already (an earlier skip of it failed before the delete)
    deleted: bool  # False: it was gone from the requests stream already (purged meanwhile)


# -- skip ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SkipTarget:
    """The request a skip would move: the paused change set's first in line."""

    workspace_id: str
    change_set_id: str
    request_id: str
    seq: int
    stream: str  # the requests stream (of its shard) holding it
    subject: str
    headers: dict[str, str] = field(repr=False)
    data: bytes = field(repr=False)


async def check_skip(
    nc: NatsClient,
    subjects: Subjects,
    workspace_id: WorkspacePk,
    change_set_id: ChangeSetId,
    request_id: RequestId | str,
) -> SkipTarget:
    """What :func:`skip_request` would move, if it may: ``NotPaused``, ``HeldByDaemon`` while a daemon still holds
    the change set, ``NotFirstInLine`` (naming the first request's id) otherwise (:mod:`rebaser_core.errors`)."""
    from rebaser_core.api import ENQUEUE_UPDATES_REQUEST  # pydantic: only here

    wk, cs = workspace_id, change_set_id
    wanted = str(request_id).upper()
    js = jetstream(nc)
    try:
        pause, workspace_pause = await pauses_of(js, subjects, wk, cs)
        if pause is None and workspace_pause is None:
            raise NotPaused(wk, cs)
        layout = await read_layout(nc, subjects)
        shards = shards_of(subjects, layout, wk, cs)
        if await task_state(nc, shards[-1], wk, cs) == "owned":
            raise HeldByDaemon(
                f"change set {wk}/{cs} is paused, but a daemon still holds it (it lets go at its next request "
                "boundary): try again in a moment, or pause it with --wait"
            )
        record = await read_record(js, subjects, wk, cs)
        first = await _first_queued(js, shards, wk, cs, record)
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    if first is None:
        raise NotFirstInLine(wk, cs, wanted, None, 0)
    names, msg = first
    seq = int(msg.seq or 0)
    headers = {str(k): str(v) for k, v in (msg.headers or {}).items()}
    data = msg.data or b""
    try:
        found: str | None = str(ENQUEUE_UPDATES_REQUEST.decode(headers, data).id)
    except ProtocolError:
        found = h.get_header(headers, h.NATS_MSG_ID)
    if found is None or found.upper() != wanted:
        raise NotFirstInLine(wk, cs, wanted, found, seq)
    return SkipTarget(
        str(wk), str(cs), found.upper(), seq, names.requests_stream, msg.subject or "", headers, data
    )


async def skip_request(
    nc: NatsClient,
    subjects: Subjects,
    workspace_id: WorkspacePk,
    change_set_id: ChangeSetId,
    request_id: RequestId | str,
) -> SkipResult:
    """Move the paused change set's first queued request, which must be ``request_id``, to the dead letters: a copy
    first (reason ``skipped by an operator``), then its delete from the requests stream. Refused, nothing done, as
    :func:`check_skip` says."""
    target = await check_skip(nc, subjects, workspace_id, change_set_id, request_id)
    seq = target.seq
    dead_letter_seq, duplicate = await _copy_to_dead_letters(
        nc, subjects, target.subject, target.headers, target.data, seq
    )
    deleted = await _delete(jetstream(nc), target.stream, seq, dead_letter_seq)
    return SkipResult(
        target.workspace_id,
        target.change_set_id,
        target.request_id,
        seq,
        target.stream,
        dead_letter_seq,
        duplicate,
        deleted,
    )


async def _first_queued(
    js: JetStreamContext, shards: list[Subjects], wk: WorkspacePk, cs: ChangeSetId, record: RecordView | None
) -> tuple[Subjects, RawStreamMsg] | None:
    """The first request not yet processed, and its shard's names; None if none is queued. A request at or below the
    record's watermark (in the shard it counts in) is processed, only awaiting its removal."""
    order = [names.shard for names in shards]
    start = order.index(record.shard) if record is not None and record.shard in order else 0
    for names in shards[start:]:
        after = record.applied_seq if record is not None and record.shard == names.shard else 0
        try:
            # From the stream leader (not a direct get a lagging replica may answer).
            msg = await js.get_msg(
                names.requests_stream, seq=after + 1, subject=names.requests(wk, cs), next=True
            )
        except NotFoundError:
            continue
        return names, msg
    return None


async def _copy_to_dead_letters(
    nc: NatsClient, subjects: Subjects, subject: str, headers: dict[str, str], data: bytes, seq: int
) -> tuple[int, bool]:
    """Store the request's copy as the daemons do (rebaser_core.dead_letter_copy), keeping its whole body."""
    target = dead_letter_subject(subjects, subject)
    kept, body = bounded_copy(headers, data, max_body=len(data))
    marks = dead_letter_marks(subjects, subject, seq, SKIP_REASON)
    try:
        ack = await nc.request(target, body, headers={**kept, **marks}, timeout=OPERATOR_TIMEOUT)
    except nats.errors.NoRespondersError:
        raise RebaserUnavailable(f"no stream stores {target}: has a daemon set this deployment up?") from None
    except (TimeoutError, nats.errors.Error) as err:
        raise RebaserUnavailable(
            f"copying request seq {seq} to the dead letters failed ({err or type(err).__name__}): nothing was "
            "skipped"
        ) from None
    stored = check_pub_ack(ack.data, target) or 0
    return stored, bool(json.loads(ack.data).get("duplicate", False))


async def _delete(js: JetStreamContext, stream: str, seq: int, dead_letter_seq: int) -> bool:
    try:
        await js.delete_msg(stream, seq)
    except (NotFoundError, APIError) as err:
        if isinstance(err, APIError) and err.err_code != _NO_MESSAGE:
            raise RebaserRefused(
                f"request seq {seq} was copied to dead letter {dead_letter_seq} but not deleted from {stream}: "
                f"{err}; skipping it again stores no second copy"
            ) from None
        return False  # removed meanwhile
    except (TimeoutError, nats.errors.Error) as err:
        raise RebaserUnavailable(
            f"request seq {seq} was copied to dead letter {dead_letter_seq} but not deleted from {stream} "
            f"({err or type(err).__name__}); skipping it again stores no second copy"
        ) from None
    return True
