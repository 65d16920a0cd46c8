"""Dead letters, read for operators (``rebaser dlq list`` and ``show``): what each one is, why it was refused."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from rebaser_client._jetstream import OPERATOR_TIMEOUT, js_error, parse_ids
from rebaser_client.admin.reader import Progress, no_progress
from rebaser_core import headers as h
from rebaser_core.errors import ProtocolError, RebaserRefused
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.subjects import Subjects

__all__ = ["DeadLetter", "NoDeadLetter", "dead_letter", "dead_letters"]


class NoDeadLetter(RebaserRefused):
    """No dead letter at ``seq``: there never was one, or it was replayed or dropped since. The same message for
    every command that names one (``dlq show``, ``replay``, ``drop``)."""

    def __init__(self, seq: int) -> None:
        super().__init__(f"no dead letter at sequence {seq} (see `rebaser dlq list`)")
        self.seq = seq


# -- dead letters --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeadLetter:
    seq: int
    time: datetime | None
    subject: str  # the request's original subject
    original_seq: int | None
    reason: str
    request_id: str | None
    workspace_id: str | None
    change_set_id: str | None
    size: int
    truncated: int | None  # the original body length, when the copy was cut
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    data: bytes = field(default=b"", repr=False)
    # Where the app raised the exception that dead-lettered it: its frames, outermost first (None: not an app's).
    trace: str | None = None

    def body(self) -> Any:
        """The request as JSON-able data if it can be decoded, else None."""
        from rebaser_core.api import ENQUEUE_UPDATES_REQUEST  # pydantic: only once there is a letter to read

        try:
            return ENQUEUE_UPDATES_REQUEST.decode(self.request_headers(), self.data).model_dump(mode="json")
        except ProtocolError:
            return None

    def request_headers(self) -> dict[str, str]:
        """The request's own headers as kept in the copy (the dead letter's marks left out)."""
        marks = {
            name.lower()
            for name in (
                h.DEAD_LETTER_REASON,
                h.DEAD_LETTER_SUBJECT,
                h.DEAD_LETTER_SEQUENCE,
                h.DEAD_LETTER_TRUNCATED,
                h.DEAD_LETTER_HEADERS_DROPPED,
                h.DEAD_LETTER_TRACE,
            )
        }
        return {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in marks and not k.lower().startswith("nats-")
        }


def _dead_letter(msg: Any, subjects: Subjects) -> DeadLetter:
    headers = {str(k): str(v) for k, v in (msg.headers or {}).items()}
    data = msg.data or b""
    subject = h.get_header(headers, h.DEAD_LETTER_SUBJECT) or ""
    ids = parse_ids(subject, subjects.parse_any_requests)  # a request subject of any shard
    original = h.get_header(headers, h.DEAD_LETTER_SEQUENCE)
    truncated = h.get_header(headers, h.DEAD_LETTER_TRUNCATED)
    letter = DeadLetter(
        seq=int(msg.seq or 0),
        time=msg.time,
        subject=subject,
        original_seq=int(original) if original and original.isdigit() else None,
        reason=h.get_header(headers, h.DEAD_LETTER_REASON) or "",
        request_id=None,
        workspace_id=ids[0] if ids else None,
        change_set_id=ids[1] if ids else None,
        size=len(data),
        truncated=int(truncated) if truncated and truncated.isdigit() else None,
        headers=headers,
        data=data,
        trace=h.get_header(headers, h.DEAD_LETTER_TRACE),
    )
    body = letter.body()
    # The request's own Nats-Msg-Id is not kept in the copy (the dead letter's is its original sequence): the id is
    # known only if the body can be decoded.
    rid = body.get("id") if isinstance(body, dict) else None
    return replace(letter, request_id=rid)


async def dead_letters(
    nc: NatsClient,
    subjects: Subjects,
    *,
    workspace_id: WorkspacePk | None = None,
    change_set_id: ChangeSetId | None = None,
    limit: int = 50,
    progress: Progress = no_progress,
) -> tuple[int, list[DeadLetter]]:
    """(how many there are, the oldest ``limit`` of them), of one change set if both ids are given, of one workspace
    if only its id is."""
    js = nc.jetstream(timeout=OPERATOR_TIMEOUT)
    stream = subjects.dead_letter_stream
    if workspace_id is not None and change_set_id is not None:
        filter_ = subjects.dead_letter(workspace_id, change_set_id)
    elif workspace_id is not None:
        filter_ = subjects.dead_letters_of_workspace(workspace_id)
    else:
        filter_ = subjects.dead_letters_all
    found: list[DeadLetter] = []
    try:
        info = await js.stream_info(stream, subjects_filter=filter_)
        total = sum((info.state.subjects or {}).values())
        seq = 0
        while len(found) < min(limit, total):
            try:
                msg = await js.get_msg(stream, seq=seq + 1, subject=filter_, next=True, direct=True)
            except NotFoundError:
                break
            seq = int(msg.seq or seq + 1)
            found.append(_dead_letter(msg, subjects))
            progress(len(found), min(limit, total))
    except (TimeoutError, nats.errors.Error, NotFoundError) as err:
        raise js_error(err, subjects) from None
    return total, found


async def dead_letter(nc: NatsClient, subjects: Subjects, seq: int) -> DeadLetter | None:
    """The dead letter at ``seq``, or None if there is none."""
    js = nc.jetstream(timeout=OPERATOR_TIMEOUT)
    try:
        msg = await js.get_msg(subjects.dead_letter_stream, seq=seq, direct=True)
    except NotFoundError:
        return None
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    return _dead_letter(msg, subjects)
