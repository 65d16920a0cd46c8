"""What a dead letter holds: the request's headers and body, bounded, and the marks saying why and where from.

One definition for everyone who copies a request to the dead-letter stream: the daemons (a request refused, or
failing ``max_attempts`` times) and operators (``rebaser change-set skip``, in ``rebaser_client._skipping``).
``rebaser dlq list``/``show``/``replay`` read what is written here (``rebaser_client.admin.dead_letters``).

The copy's ``Nats-Msg-Id`` is ``<requests stream>:<sequence>`` of the original: a request copied twice (its
delete failed, or a daemon and an operator both copied it) is stored once.
"""

from __future__ import annotations

from collections.abc import Mapping

from rebaser_core import headers as h
from rebaser_core.errors import InvalidSubject
from rebaser_core.subjects import Subjects

__all__ = ["MAX_REASON", "bounded_copy", "dead_letter_marks", "dead_letter_subject", "one_ascii_line"]

# A dead letter's reason is one header value: one line, ASCII (nats-py reads other values back as email Header
# objects), bounded.
MAX_REASON = 1024
# Original headers kept in a dead letter: each at most this long, all together within MAX_HEADER_BYTES minus room
# for the marks.
_MAX_KEPT_HEADER = 1024
_MAX_KEPT_HEADERS = h.MAX_HEADER_BYTES - 3 * MAX_REASON  # the reason, the subject and the trace


def one_ascii_line(text: str, limit: int) -> str:
    return " ".join(text.split()).encode("ascii", "backslashreplace").decode()[:limit]


def dead_letter_subject(subjects: Subjects, subject: str) -> str:
    """Where the dead letter of a request stored on ``subject`` (a request subject of any shard) goes."""
    try:
        change_set = subjects.parse_any_requests(subject)
    except InvalidSubject:
        return subjects.dead_letter_malformed
    return subjects.dead_letter(change_set.workspace_id, change_set.change_set_id)


def dead_letter_marks(
    subjects: Subjects, subject: str, seq: int, reason: str, *, trace: str | None = None
) -> dict[str, str]:
    """The headers a dead letter gains: why, the original subject and sequence, the dedupe id, and (an app's
    failure) where in the app it was raised."""
    marks = {
        h.DEAD_LETTER_REASON: one_ascii_line(reason, MAX_REASON),
        h.DEAD_LETTER_SUBJECT: one_ascii_line(subject, MAX_REASON),
        h.DEAD_LETTER_SEQUENCE: str(seq),
        h.NATS_MSG_ID: f"{subjects.for_shard(subjects.shard_of_subject(subject)).requests_stream}:{seq}",
    }
    if trace:
        marks[h.DEAD_LETTER_TRACE] = one_ascii_line(trace, MAX_REASON)
    return marks


def bounded_copy(
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
        kept[name] = one_ascii_line(str(value), _MAX_KEPT_HEADER)
        total += size
    if dropped:
        kept[h.DEAD_LETTER_HEADERS_DROPPED] = str(dropped)
    body = data
    if len(body) > max_body:
        kept[h.DEAD_LETTER_TRUNCATED] = str(len(body))
        body = body[:max_body]
    return kept, body
