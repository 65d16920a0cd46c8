"""Header names of the wire protocol (see ``docs/protocol.md``)."""

from __future__ import annotations

__all__ = [
    "CONTENT_TYPE",
    "DEAD_LETTER_REASON",
    "DEAD_LETTER_SEQUENCE",
    "DEAD_LETTER_SUBJECT",
    "MESSAGE_TYPE",
    "MESSAGE_VERSION",
    "NATS_MSG_ID",
    "REPLY_INBOX",
]

CONTENT_TYPE = "X-CONTENT-TYPE"
MESSAGE_TYPE = "X-MESSAGE-TYPE"
MESSAGE_VERSION = "X-MESSAGE-VERSION"
NATS_MSG_ID = "Nats-Msg-Id"
REPLY_INBOX = "X-Reply-Inbox"

# Added when a request is copied to the dead-letter stream.
DEAD_LETTER_REASON = "X-Rebaser-Dead-Letter-Reason"
DEAD_LETTER_SUBJECT = "X-Rebaser-Original-Subject"
DEAD_LETTER_SEQUENCE = "X-Rebaser-Original-Sequence"
