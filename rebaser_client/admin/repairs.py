"""What operators change: purge a change set's queued requests, replay or drop dead letters.

**Replay is a new attempt, under a new request id.** The dead-lettered request's own id cannot be reused: within
the dedupe window JetStream would drop the copy as a duplicate of the original, and after it the daemon would
answer it from the change set's record (a request refused while applied has its error reply recorded there)
instead of applying it. So the replay is the same request with a fresh id, published as a new message: its stream
sequence is above the record's watermark (``applied_seq``), so it is applied in its turn, after whatever is queued.
The new id is *derived* from the dead letter (its time, its sequence and the original id): replaying the same dead
letter twice (a replay that crashed after its publish, before the dead letter was deleted) publishes the same id,
which JetStream drops as a duplicate within the window and the daemon answers from the record after it, so one
dead letter is applied at most once. The replay carries no reply inbox (its first caller has long had its error
reply) but ``X-Rebaser-Replay-Of: <original id>``; its outcome is read with the ``reply`` query by its new id. The
dead letter is deleted only once JetStream has acked the publish.

**Purge while a daemon owns the change set.** ``purge_change_set`` removes the requests stored up to the last one it
saw (requests arriving meanwhile are kept). An owner's ordered consumer reads ahead: requests it has already been
delivered are still applied and answered even though they are gone from the stream (the record's watermark keeps
that safe). Callers of purged requests get no reply and time out (``RebaserTimeout``: "may still be applied").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js.errors import APIError, NotFoundError
from ulid import ULID

from rebaser_client._jetstream import OPERATOR_TIMEOUT, js_error, task_state
from rebaser_client._routing import fetch_layout, routed
from rebaser_client.admin.dead_letters import DeadLetter, NoDeadLetter, dead_letter
from rebaser_client.admin.reader import Progress, no_progress
from rebaser_core import headers as h
from rebaser_core.api import ENQUEUE_UPDATES_REQUEST, ContentType, EnqueueUpdatesRequest
from rebaser_core.errors import ProtocolError, RebaserError, RebaserRefused, RebaserUnavailable, Unsupported
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.layout import Layout
from rebaser_core.nats.tasks import check_pub_ack, publish_task
from rebaser_core.subjects import Subjects

__all__ = [
    "REPLAY_OF",
    "PurgeResult",
    "ReplayResult",
    "check_replayable",
    "drop_dead_letters",
    "purge_change_set",
    "replay_dead_letter",
    "replay_dead_letters",
    "replay_id",
]

REPLAY_OF = "X-Rebaser-Replay-Of"
_JS_API = "$JS.API"
# nats-server's answer to deleting a sequence that holds no message ("stream store EOF" past the end, "no message
# found" inside the stream); nats-py raises it as a plain APIError.
_NO_MESSAGE = 10057


def _unavailable(err: BaseException) -> RebaserUnavailable:
    return RebaserUnavailable(f"JetStream did not answer: {err or type(err).__name__}")


async def _purge(nc: NatsClient, stream: str, request: dict[str, object]) -> int:
    """Purge ``stream`` as asked; the number of messages removed (nats-py's purge_stream only says "success")."""
    try:
        reply = await nc.request(
            f"{_JS_API}.STREAM.PURGE.{stream}", json.dumps(request).encode(), timeout=OPERATOR_TIMEOUT
        )
    except (TimeoutError, nats.errors.Error) as err:
        raise _unavailable(err) from None
    data = json.loads(reply.data)
    if "error" in data:
        raise RebaserRefused(f"purging {stream} failed: {data['error'].get('description', data['error'])}")
    return int(data.get("purged", 0))


# -- purge ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PurgeResult:
    removed: int
    # Every request of the change set stored up to this sequence was removed (0: none was queued); while the layout
    # changes, the highest of its two shards'.
    upto_seq: int
    task: str  # the change set's task then: owned (by a daemon), waiting (for one) or none


async def purge_change_set(
    nc: NatsClient, subjects: Subjects, workspace_id: WorkspacePk, change_set_id: ChangeSetId
) -> PurgeResult:
    """Purge the change set's requests in its shard, and while the layout changes in its old shard too (whose
    requests would otherwise still be applied, first)."""
    layout = await _layout(nc, subjects)
    current = subjects if layout is None else subjects.for_shard(layout.shard_of(workspace_id, change_set_id))
    old = None if layout is None else layout.old_shard_of(workspace_id, change_set_id)
    shards = [current] if old is None else [subjects.for_shard(old), current]
    js = nc.jetstream(timeout=OPERATOR_TIMEOUT)
    task = await task_state(nc, current, workspace_id, change_set_id)
    removed = upto = 0
    for names in shards:
        subject = names.requests(workspace_id, change_set_id)
        try:
            # From the stream leader (not a direct get a lagging replica may answer): the purge covers what it saw.
            last = await js.get_last_msg(names.requests_stream, subject)
        except NotFoundError:
            continue
        except (TimeoutError, nats.errors.Error) as err:
            raise js_error(err, names) from None
        upto = max(upto, int(last.seq or 0))
        removed += await _purge(nc, names.requests_stream, {"filter": subject, "seq": int(last.seq or 0) + 1})
    return PurgeResult(removed, upto, task)


async def _layout(nc: NatsClient, subjects: Subjects) -> Layout | None:
    """The cluster's shard layout (one line if NATS does not answer)."""
    try:
        return await fetch_layout(nc, subjects)
    except (TimeoutError, nats.errors.Error) as err:
        raise _unavailable(err) from None


# -- dead letters --------------------------------------------------------------------------------------------------
def replay_id(letter: DeadLetter, stream: str) -> RequestId:
    """The id a replay of ``letter`` gets: a ULID with the dead letter's time and 80 bits of a hash of what
    identifies it, so replaying the same dead letter again gives the same id (see the module docstring)."""
    millis = int(letter.time.timestamp() * 1000) if letter.time is not None else 0
    digest = hashlib.sha256(
        f"{stream}:{letter.seq}:{letter.request_id}:{letter.original_seq}".encode()
    ).digest()
    return RequestId(ULID.from_bytes(millis.to_bytes(6, "big") + digest[:10]))


@dataclass(frozen=True)
class ReplayResult:
    dead_letter_seq: int
    original_id: str
    request_id: str  # the replay's own id
    subject: str
    stream_seq: int
    duplicate: bool  # JetStream already held this replay (replayed before, dead letter not deleted then)


def check_replayable(letter: DeadLetter) -> EnqueueUpdatesRequest:
    """The request ``letter`` holds, if it can be replayed; :class:`RebaserRefused` saying why not otherwise."""
    seq = letter.seq
    if letter.workspace_id is None or letter.change_set_id is None:
        raise RebaserRefused(
            f"dead letter {seq} cannot be replayed: {letter.subject!r} is not a request subject"
        )
    if letter.truncated is not None:
        raise RebaserRefused(
            f"dead letter {seq} cannot be replayed: only {letter.size} of its {letter.truncated} bytes were kept"
        )
    headers = letter.request_headers()
    try:
        request = ENQUEUE_UPDATES_REQUEST.decode(headers, letter.data)
    except ProtocolError as err:
        raise RebaserRefused(f"dead letter {seq} cannot be replayed: {type(err).__name__}: {err}") from None
    wk, cs = WorkspacePk(letter.workspace_id), ChangeSetId(letter.change_set_id)
    if (request.workspace_id, request.change_set_id) != (wk, cs):
        raise RebaserRefused(
            f"dead letter {seq} cannot be replayed: its body is for {request.workspace_id}/{request.change_set_id}, "
            f"it was published on {letter.subject}"
        )
    return request


async def replay_dead_letter(nc: NatsClient, subjects: Subjects, seq: int) -> ReplayResult:
    """Publish the dead letter at ``seq`` again as a new request, give its change set a task, delete the dead
    letter. :class:`RebaserRefused` (nothing done) if it cannot be replayed, and says why: :class:`NoDeadLetter`
    if there is none at ``seq`` (replayed or dropped already)."""
    letter = await dead_letter(nc, subjects, seq)
    if letter is None:
        raise NoDeadLetter(seq)
    request = check_replayable(letter)
    headers = letter.request_headers()
    wk, cs = request.workspace_id, request.change_set_id
    new_id = replay_id(letter, subjects.dead_letter_stream)
    names = await routed(nc, subjects, wk, cs)  # the change set's shard now
    try:
        content_type = ContentType.parse(h.get_header(headers, h.CONTENT_TYPE) or ContentType.CBOR.value)
    except Unsupported:
        content_type = ContentType.CBOR
    out_headers, body = ENQUEUE_UPDATES_REQUEST.encode(
        request.model_copy(update={"id": new_id}), content_type
    )
    out_headers["Nats-Expected-Stream"] = names.requests_stream
    out_headers[REPLAY_OF] = str(request.id)
    subject = names.requests(wk, cs)
    try:
        ack = await nc.request(subject, body, headers=out_headers, timeout=OPERATOR_TIMEOUT)
    except nats.errors.NoRespondersError:
        raise RebaserUnavailable(
            f"no stream stores {subject}: has a daemon set this deployment up?"
        ) from None
    except (TimeoutError, nats.errors.Error) as err:
        raise _unavailable(err) from None
    stream_seq = check_pub_ack(ack.data, subject) or 0
    duplicate = bool(json.loads(ack.data).get("duplicate", False))
    # The task after the request, as every caller does; if it fails, the orphan sweep gives the request one.
    await publish_task(nc, names.task(wk, cs), timeout=OPERATOR_TIMEOUT)
    js = nc.jetstream(timeout=OPERATOR_TIMEOUT)
    try:
        await js.delete_msg(subjects.dead_letter_stream, seq)
    except (NotFoundError, APIError) as err:
        # Dropped meanwhile (by someone else, or by the stream's limits): fine. Anything else is worth a line.
        if isinstance(err, APIError) and err.err_code != _NO_MESSAGE:
            raise RebaserRefused(
                f"dead letter {seq} was replayed as {new_id} but could not be deleted: {err}; replaying it again "
                "publishes the same id, which is not applied twice"
            ) from None
    except (TimeoutError, nats.errors.Error) as err:
        raise RebaserUnavailable(
            f"dead letter {seq} was replayed as {new_id} but could not be deleted ({err or type(err).__name__}); "
            "replaying it again publishes the same id, which is not applied twice"
        ) from None
    return ReplayResult(seq, str(request.id), str(new_id), subject, stream_seq, duplicate)


async def replay_dead_letters(
    nc: NatsClient,
    subjects: Subjects,
    seqs: Sequence[int],
    *,
    keep_going: bool = True,
    progress: Progress = no_progress,
) -> list[ReplayResult | tuple[int, RebaserError]]:
    """Replay each dead letter of ``seqs`` in turn (``rebaser dlq replay`` and the web console's replay, one or
    many): its result, or (its sequence, why it was not replayed). ``keep_going=False``: the first error is raised,
    and those after it are not tried."""
    done: list[ReplayResult | tuple[int, RebaserError]] = []
    for seq in seqs:
        try:
            done.append(await replay_dead_letter(nc, subjects, seq))
        except RebaserError as err:
            if not keep_going:
                raise
            done.append((seq, err))
        progress(len(done), len(seqs))
    return done


async def drop_dead_letters(
    nc: NatsClient,
    subjects: Subjects,
    seqs: tuple[int, ...] = (),
    *,
    workspace_id: WorkspacePk | None = None,
    change_set_id: ChangeSetId | None = None,
    everything: bool = False,
) -> int:
    """Delete dead letters by sequence, or (``everything``) all of them, or all of one change set; how many."""
    stream = subjects.dead_letter_stream
    if everything:
        request: dict[str, object] = {}
        if workspace_id is not None and change_set_id is not None:
            request["filter"] = subjects.dead_letter(workspace_id, change_set_id)
        return await _purge(nc, stream, request)
    js = nc.jetstream(timeout=OPERATOR_TIMEOUT)
    dropped = 0
    for seq in seqs:
        try:
            await js.delete_msg(stream, seq)
            dropped += 1
        except (NotFoundError, APIError) as err:
            if isinstance(err, APIError) and err.err_code != _NO_MESSAGE:
                raise RebaserRefused(f"deleting dead letter {seq} failed: {err}") from None
            if not dropped:
                raise NoDeadLetter(seq) from None
            raise RebaserRefused(
                f"no dead letter at sequence {seq} any more ({dropped} dropped before it)"
            ) from None
        except (TimeoutError, nats.errors.Error) as err:
            raise _unavailable(err) from None
    return dropped
