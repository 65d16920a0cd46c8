"""Replies to callers and copies to the dead-letter stream."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import nats.errors
from nats.aio.msg import Msg

from rebaser_core import headers as h
from rebaser_core.api import ENQUEUE_UPDATES_RESPONSE, ContentType, EnqueueUpdatesResponse
from rebaser_core.errors import InvalidReplyInbox, InvalidSubject, RebaserRefused, Unsupported
from rebaser_core.ids import RequestId
from rebaser_core.inbox import reply_inbox_of
from rebaser_core.tasks import check_pub_ack
from rebaser_server.changeset.runtime import Runtime

__all__ = [
    "UNCHECKED",
    "Unchecked",
    "dead_letter",
    "dead_letter_stored",
    "reply_inbox",
    "request_id_of",
    "send_reply",
]

log = logging.getLogger(__name__)


def request_id_of(headers: Mapping[str, str] | None) -> RequestId:
    """The request id a caller put in ``Nats-Msg-Id``, for replying to a message we could not decode; a fresh id
    if it sent none usable (it cannot be matching replies on one then)."""
    try:
        return RequestId(h.get_header(headers, h.NATS_MSG_ID) or "")
    except ValueError:
        return RequestId.new()


def reply_inbox(rt: Runtime, headers: Mapping[str, str] | None) -> str | None:
    """The request's reply inbox if the daemon may publish to it (None: no reply wanted); else
    :class:`InvalidReplyInbox`, and the request is refused (``rebaser_core.inbox`` has the rule)."""
    return reply_inbox_of(headers, rt.settings.reply_inbox_prefix, rt.subjects)


class Unchecked:
    """The reply inbox is still to be read from the request's headers and checked."""


UNCHECKED = Unchecked()


async def send_reply(
    rt: Runtime,
    request_headers: dict[str, str],
    response: EnqueueUpdatesResponse,
    inbox: str | Unchecked | None = UNCHECKED,
) -> None:
    """Reply on the request's ``X-Reply-Inbox`` (if it has a valid one), in the content type the caller used.
    ``inbox``: the request's inbox as :func:`reply_inbox` returned it, if the caller checked it already.

    Replies are core NATS, at most once: a caller that missed one still has its request applied, and asking again
    with the same request id is answered from the idempotency record.
    """
    if isinstance(inbox, Unchecked):
        try:
            inbox = reply_inbox(rt, request_headers)
        except InvalidReplyInbox:
            return  # the request was refused for it (dead-lettered); there is nowhere safe to answer
    if not inbox:
        return
    try:
        content_type = ContentType.parse(
            h.get_header(request_headers, h.CONTENT_TYPE) or ContentType.CBOR.value
        )
    except Unsupported:
        content_type = (
            ContentType.JSON
        )  # the caller's own type is unusable; JSON is the most readable fallback
    headers, body = ENQUEUE_UPDATES_RESPONSE.encode(response, content_type)
    try:
        with rt.observe.reply(
            request_headers, headers
        ):  # its span; the trace context of the request it answers
            await rt.nc.publish(inbox, body, headers=headers)
    except Exception as err:
        log.warning("reply to %s failed: %s", inbox, err)


async def dead_letter(rt: Runtime, msg: Msg, seq: int, reason: str) -> bool:
    """Copy the request, bounded, with the reason, to the dead-letter stream and wait for the stream's ack.

    Never raises: a request being dead-lettered must end whatever happens to its copy. If JetStream refuses the
    copy it is tried once more without the original headers and body; if that fails too (or the stream cannot be
    reached), the copy is given up, logged and counted (``dead_letter_failures``), and False returned.
    """
    return await dead_letter_stored(rt, msg.subject, msg.headers, msg.data, seq, reason)


async def dead_letter_stored(
    rt: Runtime, subject: str, original_headers: Mapping[str, str] | None, data: bytes, seq: int, reason: str
) -> bool:
    """:func:`dead_letter` for a stored request given by its parts (the orphan sweep reads them by sequence)."""
    try:
        change_set = rt.subjects.parse_any_requests(subject)
        target = rt.subjects.dead_letter(change_set.workspace_id, change_set.change_set_id)
    except InvalidSubject:
        target = rt.subjects.dead_letter_malformed
    reason = _one_ascii_line(reason, _MAX_REASON)
    marks = {
        h.DEAD_LETTER_REASON: reason,
        h.DEAD_LETTER_SUBJECT: _one_ascii_line(subject, _MAX_REASON),
        h.DEAD_LETTER_SEQUENCE: str(seq),
        # Dedupe by original sequence: a request dead-lettered twice (its delete failed) is stored once.
        h.NATS_MSG_ID: f"{rt.subjects.for_shard(rt.subjects.shard_of_subject(subject)).requests_stream}:{seq}",
    }
    headers, body = _bounded_copy(original_headers, data, rt.settings.dead_letter_max_body)
    try:
        await _store(rt, target, body, {**headers, **marks})
    except RebaserRefused as err:
        log.warning("dead letter of seq %d refused (%s); storing it without headers and body", seq, err)
        try:
            await _store(rt, target, b"", {**marks, h.DEAD_LETTER_TRUNCATED: str(len(data))})
        except Exception as again:
            return _given_up(rt, seq, marks[h.DEAD_LETTER_SUBJECT], reason, again)
    except Exception as err:
        return _given_up(rt, seq, marks[h.DEAD_LETTER_SUBJECT], reason, err)
    rt.stats.requests_dead_lettered += 1
    log.warning("dead-lettered request seq %d of %s: %s", seq, marks[h.DEAD_LETTER_SUBJECT][:200], reason)
    return True


# A dead letter's reason is one header value: one line, ASCII (nats-py reads other values back as email Header
# objects), bounded.
_MAX_REASON = 1024
# Original headers kept in a dead letter: each at most this long, all together within MAX_HEADER_BYTES minus room
# for the headers the daemon adds.
_MAX_KEPT_HEADER = 1024
_MAX_KEPT_HEADERS = h.MAX_HEADER_BYTES - 2 * _MAX_REASON


def _one_ascii_line(text: str, limit: int) -> str:
    return " ".join(text.split()).encode("ascii", "backslashreplace").decode()[:limit]


def _bounded_copy(
    headers: Mapping[str, str] | None, data: bytes, max_body: int
) -> tuple[dict[str, str], bytes]:
    """The request's headers and body as the dead letter keeps them: JetStream's own ``Nats-*`` headers left out,
    oversized headers dropped (counted), the body cut to ``max_body`` bytes (its length noted)."""
    kept: dict[str, str] = {}
    dropped, total = 0, 0
    for name, value in (headers or {}).items():
        if name.lower().startswith("nats-"):  # JetStream's own, in whatever case the caller wrote them
            continue
        size = len(name) + len(str(value)) + 4
        if len(name) > 128 or size > _MAX_KEPT_HEADER or total + size > _MAX_KEPT_HEADERS:
            dropped += 1
            continue
        kept[name] = _one_ascii_line(str(value), _MAX_KEPT_HEADER)
        total += size
    if dropped:
        kept[h.DEAD_LETTER_HEADERS_DROPPED] = str(dropped)
    body = data
    if len(body) > max_body:
        kept[h.DEAD_LETTER_TRUNCATED] = str(len(body))
        body = body[:max_body]
    return kept, body


async def _store(rt: Runtime, subject: str, body: bytes, headers: dict[str, str]) -> None:
    try:
        reply = await rt.nc.request(subject, body, headers=headers, timeout=rt.settings.nats_timeout)
    except nats.errors.NoRespondersError:
        raise RebaserRefused(f"no stream stores {subject}") from None
    check_pub_ack(reply.data, subject)


def _given_up(rt: Runtime, seq: int, subject: str, reason: str, err: BaseException) -> bool:
    rt.stats.dead_letter_failures += 1
    log.error("could not dead-letter request seq %d of %s (%s); it is dropped: %s", seq, subject, err, reason)
    return False
