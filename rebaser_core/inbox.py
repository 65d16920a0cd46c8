"""What a reply inbox may be: the one rule, used wherever the daemon publishes to a subject a caller named.

A reply inbox (``X-Reply-Inbox`` of a request, the NATS reply subject of a query) is a publish target chosen by
whoever sent the message. Used unchecked it lets a caller make the daemon write anywhere its own credentials
reach: over another workspace's change-set record (``$KV.…``), into object-store metadata (``$O.…``), into the
deployment's own streams, or a control line so long that the server drops the daemon's connection. So an inbox
MUST (``docs/protocol.md`` §3.1):

- start with the deployment's inbox prefix (``Settings.reply_inbox_prefix``, default ``_INBOX.``) and have at
  least one token after it;
- be at most ``MAX_INBOX_BYTES`` bytes;
- consist of tokens of printable ASCII other than ``.``, ``*`` and ``>`` (no empty token, no whitespace, no
  wildcard);
- never be a ``$`` subject (JetStream, KV, object store, system) nor lie under the subjects the daemon itself
  writes and reads (``[P.]rebaser.``, ``[P.]dlq.``, or all of ``P.`` with a prefix ``P``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from rebaser_core import headers as h
from rebaser_core.errors import InvalidReplyInbox
from rebaser_core.ids import RequestId
from rebaser_core.subjects import Subjects

__all__ = [
    "DEFAULT_INBOX_PREFIX",
    "MAX_INBOX_BYTES",
    "SERVICE_REPLY_PREFIX",
    "check_inbox_prefix",
    "check_query_reply",
    "check_reply_inbox",
    "reply_inbox_of",
    "request_id_of",
]

DEFAULT_INBOX_PREFIX = "_INBOX."
# Where nats-server sends the answer to a request that came from another account through a service import: it
# rewrites the request's reply subject to ``_R_.<id>.<id>`` in the exporting (the daemons') account and routes a
# publish there back to the caller's account, to the caller's own reply subject (docs/nats-accounts.conf).
SERVICE_REPLY_PREFIX = "_R_."
MAX_INBOX_BYTES = 255
# One subject token: printable ASCII except the separator and the wildcards; a subject: tokens joined by dots.
_TOKEN_CHARS = r"[!-)+-\-/-=?-~]+"
_SUBJECT = re.compile(rf"{_TOKEN_CHARS}(?:\.{_TOKEN_CHARS})*")


def _reserved(subjects: Subjects) -> tuple[str, ...]:
    """Subject spaces an inbox must never enter: the daemon's own."""
    if subjects.prefix:
        return ("$", f"{subjects.prefix}.")
    return ("$", "rebaser.", "dlq.")


def _check_tokens(subject: str, what: str) -> None:
    if not _SUBJECT.fullmatch(subject):  # every token non-empty and made of _TOKEN_CHARS
        raise InvalidReplyInbox(
            f"{what} {_shown(subject)} has an empty token, whitespace, a wildcard or a non-ASCII character"
        )


def _shown(value: str) -> str:
    """A caller's value, quoted, cut short and ASCII: it goes into logs and dead-letter reasons (header values)."""
    shown = repr(value[:80] + "...") if len(value) > 80 else repr(value)
    return shown.encode("ascii", "backslashreplace").decode()


def check_inbox_prefix(prefix: str, subjects: Subjects) -> str:
    """Validate a deployment's inbox prefix (``Settings.reply_inbox_prefix``)."""
    if not prefix.endswith(".") or len(prefix.encode()) >= MAX_INBOX_BYTES:
        raise InvalidReplyInbox(f"inbox prefix {_shown(prefix)} must end with '.' and be short")
    _check_tokens(prefix[:-1], "inbox prefix")
    if prefix.startswith(_reserved(subjects)):
        raise InvalidReplyInbox(f"inbox prefix {_shown(prefix)} lies under a subject the daemon uses")
    return prefix


def check_reply_inbox(inbox: str, prefix: str, subjects: Subjects) -> str:
    """Return ``inbox`` if the daemon may publish a reply to it; else raise :class:`InvalidReplyInbox`."""
    if len(inbox.encode("utf-8", "surrogatepass")) > MAX_INBOX_BYTES:
        raise InvalidReplyInbox(
            f"reply inbox of {len(inbox)} characters is longer than {MAX_INBOX_BYTES} bytes"
        )
    if not inbox.startswith(prefix) or len(inbox) == len(prefix):
        raise InvalidReplyInbox(
            f"reply inbox {_shown(inbox)} does not start with the inbox prefix {prefix!r}"
        )
    _check_tokens(inbox, "reply inbox")
    if inbox.startswith(_reserved(subjects)):
        raise InvalidReplyInbox(f"reply inbox {_shown(inbox)} lies under a subject the daemon uses")
    return inbox


def check_query_reply(reply: str, prefix: str, subjects: Subjects) -> str:
    """Return a query's NATS reply subject if the daemon may answer on it: a reply inbox (:func:`check_reply_inbox`),
    or the response subject nats-server made for a query that came through a service import (a caller in an
    account of its own). A ``_R_.`` subject lies in no stream and is routed only to the account that asked."""
    if reply.startswith(SERVICE_REPLY_PREFIX) and len(reply) > len(SERVICE_REPLY_PREFIX):
        if len(reply.encode("utf-8", "surrogatepass")) > MAX_INBOX_BYTES:
            raise InvalidReplyInbox(
                f"reply subject of {len(reply)} characters is longer than {MAX_INBOX_BYTES} bytes"
            )
        _check_tokens(reply, "reply subject")
        return reply
    return check_reply_inbox(reply, prefix, subjects)


def reply_inbox_of(headers: Mapping[str, str] | None, prefix: str, subjects: Subjects) -> str | None:
    """The request's checked ``X-Reply-Inbox`` (matched case-insensitively), or None if it asks for no reply.

    Raises :class:`InvalidReplyInbox` if it is invalid, or given twice (in different letter cases) with
    different values.
    """
    wanted = h.REPLY_INBOX.upper()
    values = {v for k, v in (headers or {}).items() if k.upper() == wanted and v}  # empty: no reply wanted
    if not values:
        return None
    if len(values) > 1:
        raise InvalidReplyInbox("the request names more than one reply inbox")
    (inbox,) = values
    return check_reply_inbox(inbox, prefix, subjects)


def request_id_of(headers: Mapping[str, str] | None) -> RequestId:
    """The request id a caller put in ``Nats-Msg-Id``, for replying to a message we could not decode; a fresh id
    if it sent none usable (it cannot be matching replies on one then)."""
    try:
        return RequestId(h.get_header(headers, h.NATS_MSG_ID) or "")
    except ValueError:
        return RequestId.new()
