"""Replies to callers and copies to the dead-letter stream."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from nats.aio.msg import Msg

from rebaser_core import headers as h
from rebaser_core.api import ENQUEUE_UPDATES_RESPONSE, ContentType, EnqueueUpdatesResponse
from rebaser_core.errors import InvalidReplyInbox, Unsupported
from rebaser_core.ids import RequestId
from rebaser_core.inbox import reply_inbox_of
from rebaser_core.tasks import check_pub_ack
from rebaser_server.runtime import Runtime

__all__ = ["dead_letter", "reply_inbox", "request_id_of", "send_reply"]

log = logging.getLogger(__name__)


def request_id_of(headers: Mapping[str, str] | None) -> RequestId:
    """The request id a caller put in ``Nats-Msg-Id``, for replying to a message we could not decode; a fresh id
    if it sent none usable (it cannot be matching replies on one then)."""
    try:
        return RequestId((headers or {}).get(h.NATS_MSG_ID, ""))
    except ValueError:
        return RequestId.new()


def reply_inbox(rt: Runtime, headers: Mapping[str, str] | None) -> str | None:
    """The request's reply inbox if the daemon may publish to it (None: no reply wanted); else
    :class:`InvalidReplyInbox`, and the request is refused (``rebaser_core.inbox`` has the rule)."""
    return reply_inbox_of(headers, rt.settings.reply_inbox_prefix, rt.subjects)


async def send_reply(rt: Runtime, request_headers: dict[str, str], response: EnqueueUpdatesResponse) -> None:
    """Reply on the request's ``X-Reply-Inbox`` (if it has a valid one), in the content type the caller used.

    Replies are core NATS, at most once: a caller that missed one still has its request applied, and asking again
    with the same request id is answered from the idempotency record.
    """
    try:
        inbox = reply_inbox(rt, request_headers)
    except InvalidReplyInbox:
        return  # the request was refused for it (dead-lettered); there is nowhere safe to answer
    if not inbox:
        return
    try:
        content_type = ContentType.parse(request_headers.get(h.CONTENT_TYPE) or ContentType.CBOR.value)
    except Unsupported:
        content_type = (
            ContentType.JSON
        )  # the caller's own type is unusable; JSON is the most readable fallback
    headers, body = ENQUEUE_UPDATES_RESPONSE.encode(response, content_type)
    try:
        await rt.nc.publish(inbox, body, headers=headers)
    except Exception as err:
        log.warning("reply to %s failed: %s", inbox, err)


async def dead_letter(rt: Runtime, msg: Msg, seq: int, reason: str) -> None:
    """Copy the request, with the reason, to the dead-letter stream and wait for the stream's ack."""
    change_set = rt.subjects.parse_requests(msg.subject)
    subject = rt.subjects.dead_letter(change_set.workspace_id, change_set.change_set_id)
    headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-")}
    headers[h.DEAD_LETTER_REASON] = " ".join(reason.split())[:1024]  # header values are one line
    headers[h.DEAD_LETTER_SUBJECT] = msg.subject
    headers[h.DEAD_LETTER_SEQUENCE] = str(seq)
    # Dedupe by original sequence: a request dead-lettered twice (its delete failed) is stored once.
    headers[h.NATS_MSG_ID] = f"{rt.subjects.requests_stream}:{seq}"
    reply = await rt.nc.request(subject, msg.data, headers=headers, timeout=rt.settings.ack_wait)
    check_pub_ack(reply.data, subject)
    rt.stats.requests_dead_lettered += 1
    log.warning("dead-lettered request seq %d of %s: %s", seq, msg.subject, reason)
