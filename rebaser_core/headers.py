"""Header names of the wire protocol (see ``docs/protocol.md``), and the limit on a message's header block."""

from __future__ import annotations

from collections.abc import Mapping

from rebaser_core.errors import DecodeError, HeadersTooLarge, MissingHeader

__all__ = [
    "CONTENT_TYPE",
    "DEAD_LETTER_HEADERS_DROPPED",
    "DEAD_LETTER_REASON",
    "DEAD_LETTER_SEQUENCE",
    "DEAD_LETTER_SUBJECT",
    "DEAD_LETTER_TRACE",
    "DEAD_LETTER_TRUNCATED",
    "MAX_HEADER_BYTES",
    "MESSAGE_TYPE",
    "MESSAGE_VERSION",
    "NATS_MSG_ID",
    "REPLY_INBOX",
    "REPLY_VERSION",
    "check_header_block",
    "check_msg_id",
    "get_header",
    "header_block_size",
]

CONTENT_TYPE = "X-CONTENT-TYPE"
MESSAGE_TYPE = "X-MESSAGE-TYPE"
MESSAGE_VERSION = "X-MESSAGE-VERSION"
NATS_MSG_ID = "Nats-Msg-Id"
REPLY_INBOX = "X-Reply-Inbox"
# The newest EnqueueUpdatesResponse version the caller reads (rebaser_core.api.enqueue_updates_response.reads_up_to).
REPLY_VERSION = "X-Reply-Version"

# Added when a request is copied to the dead-letter stream.
DEAD_LETTER_REASON = "X-Rebaser-Dead-Letter-Reason"
DEAD_LETTER_SUBJECT = "X-Rebaser-Original-Subject"
DEAD_LETTER_SEQUENCE = "X-Rebaser-Original-Sequence"
# Where an app's exception was raised: its frames, innermost last, ``file:line in function`` (code, never data).
DEAD_LETTER_TRACE = "X-Rebaser-Dead-Letter-Trace"
# Set on a dead letter whose copy was cut down: the original body length, the number of headers left out.
DEAD_LETTER_TRUNCATED = "X-Rebaser-Dead-Letter-Truncated"
DEAD_LETTER_HEADERS_DROPPED = "X-Rebaser-Dead-Letter-Headers-Dropped"

# A header block (names and values) larger than this is refused before anything is decoded. A real request needs a
# few hundred bytes (the reply inbox is at most 255); JetStream refuses to store blocks over 64 KiB, so a request
# near that limit could not even be copied to the dead-letter stream.
MAX_HEADER_BYTES = 8 * 1024


def get_header(headers: Mapping[str, str] | None, name: str) -> str | None:
    """The value of header ``name``, its name matched case-insensitively: the one way a received header is read.

    The protocol's names are case-insensitive (docs/protocol.md §3) because client libraries differ: Go and nats.js
    canonicalise names (``X-Content-Type``), others send them lower-case (``x-reply-inbox``), and nats-py hands
    them over exactly as sent. The exact spelling is tried first (the common case, one dict lookup).
    """
    if not headers:
        return None
    value = headers.get(name)
    if value is not None:
        return value
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


def header_block_size(headers: Mapping[str, object] | None) -> int:
    """Bytes of the header block as sent: ``Name: value\r\n`` per header (the fixed preamble left out)."""
    return sum(len(str(k)) + len(str(v)) + 4 for k, v in (headers or {}).items())


def check_header_block(headers: Mapping[str, object] | None) -> None:
    """Raise :class:`HeadersTooLarge` if the header block exceeds ``MAX_HEADER_BYTES``."""
    size = header_block_size(headers)
    if size > MAX_HEADER_BYTES:
        raise HeadersTooLarge(f"header block of {size} bytes exceeds the limit of {MAX_HEADER_BYTES} bytes")


def check_msg_id(headers: Mapping[str, str] | None, request_id: str) -> None:
    """A request's ``Nats-Msg-Id`` must be its body's ``id`` (docs/protocol.md §3, §5.1).

    It is JetStream's dedupe key: without it a resent request is stored twice, and with another value two different
    requests can dedupe each other. Raises :class:`MissingHeader` or :class:`DecodeError` (the request is refused).
    """
    msg_id = get_header(headers, NATS_MSG_ID)
    if msg_id is None:
        raise MissingHeader(NATS_MSG_ID)
    if msg_id.upper() != request_id.upper():  # ULIDs: decoders accept lower case, so compare as the id
        shown = msg_id[:40].encode("ascii", "backslashreplace").decode()
        raise DecodeError(f"{NATS_MSG_ID} {shown!r} is not the body's id {request_id}")
