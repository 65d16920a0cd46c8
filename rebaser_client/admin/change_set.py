"""``rebaser change-set show``: everything JetStream holds of one change set. Its record, its task, its pauses, its
dead letters, and its queued requests in order (the first ``limit``), each read without its caller's reply.

Read-only, through :class:`~rebaser_client.admin.reader.Reader`, in the change set's shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from rebaser_client._jetstream import js_error
from rebaser_client._pause_read import pauses_of
from rebaser_client._record import RecordView
from rebaser_client._routing import routed
from rebaser_client.admin.reader import Progress, Reader, no_progress
from rebaser_core import headers as h
from rebaser_core.errors import DecodeError, ProtocolError
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.pauses import Pause
from rebaser_core.subjects import Subjects

if TYPE_CHECKING:
    # The wire models (pydantic) are imported where a request is decoded: `rebaser status` never needs them.
    from rebaser_core.api import EnqueueUpdatesRequest

__all__ = ["ChangeSetReport", "QueuedRequest", "change_set_report"]


@dataclass(frozen=True)
class QueuedRequest:
    seq: int
    request_id: str | None  # None: its id cannot be read (it will be dead-lettered)
    time: datetime | None  # when it was stored
    size: int
    summary: str  # what it asks for (or why it cannot be read)
    processed: bool  # at or below the record's watermark: done, waiting only to be purged
    attempts: int = 0  # retryable failures so far

    def age(self, now: datetime) -> float | None:
        return None if self.time is None else max(0.0, (now - self.time).total_seconds())


@dataclass(frozen=True)
class ChangeSetReport:
    workspace_id: str
    change_set_id: str
    record: RecordView | None
    task: str  # owned | waiting | none
    queued_total: int
    queued: tuple[QueuedRequest, ...]  # the first ``limit``, in order
    dead_letters: int
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    pause: Pause | None = None  # the change set's own pause
    workspace_pause: Pause | None = None  # its workspace's: it holds the change set too

    @property
    def paused(self) -> bool:
        return self.pause is not None or self.workspace_pause is not None


def _summary(request: EnqueueUpdatesRequest) -> str:
    from rebaser_core.api import InlineUpdates

    updates = request.updates
    what = (
        f"{len(updates.updates)} updates"
        if isinstance(updates, InlineUpdates)
        else f"stored batch {updates.address[:12]}"
    )
    if request.from_change_set_id is not None:
        what += f" from {request.from_change_set_id}"
    return what


def _queued(seq: int, msg: Any, record: RecordView | None) -> QueuedRequest:
    from rebaser_core.api import ENQUEUE_UPDATES_REQUEST

    headers = msg.headers or {}
    data = msg.data or b""
    try:
        request = ENQUEUE_UPDATES_REQUEST.decode(headers, data)
        rid: str | None = str(request.id)
        summary = _summary(request)
    except ProtocolError as err:
        rid = h.get_header(headers, h.NATS_MSG_ID)
        summary = f"unreadable: {type(err).__name__}: {str(err)[:120]}"
    attempts = record.attempts.get(rid or "", 0) if record else 0
    processed = record is not None and seq <= record.applied_seq
    return QueuedRequest(seq, rid, msg.time, len(data), summary, processed, attempts)


async def change_set_report(
    nc: NatsClient,
    subjects: Subjects,
    workspace_id: WorkspacePk,
    change_set_id: ChangeSetId,
    *,
    limit: int = 50,
    progress: Progress = no_progress,
) -> ChangeSetReport | None:
    """Everything about one change set; None if JetStream knows nothing of it (no record, nothing queued, no
    task, no dead letter)."""
    subjects = await routed(nc, subjects, workspace_id, change_set_id)  # the change set's shard
    r = Reader(nc, subjects)
    subject = subjects.requests(workspace_id, change_set_id)
    try:
        try:
            record = await r.record(str(workspace_id), str(change_set_id))
        except DecodeError:  # garbage: the daemons quarantine it, and its pause names the repair
            record = None
        _, queued = await r.subject_counts(subjects.requests_stream, subject)
        _, dead = await r.subject_counts(
            subjects.dead_letter_stream, subjects.dead_letter(workspace_id, change_set_id)
        )
        task = await r.task_state(workspace_id, change_set_id, await r.delivered_upto())
        pause, workspace_pause = await pauses_of(r.js, subjects, workspace_id, change_set_id)
        total = queued.get(subject, 0)
        found: list[QueuedRequest] = []
        seq = 0
        while len(found) < min(limit, total):
            try:
                msg = await r.js.get_msg(
                    subjects.requests_stream, seq=seq + 1, subject=subject, next=True, direct=True
                )
            except NotFoundError:
                break
            seq = int(msg.seq or seq + 1)
            found.append(_queued(seq, msg, record))
            progress(len(found), min(limit, total))
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    dead_count = dead.get(subjects.dead_letter(workspace_id, change_set_id), 0)
    if record is None and not total and task == "none" and not dead_count and pause is None:
        return None
    return ChangeSetReport(
        str(workspace_id),
        str(change_set_id),
        record,
        task,
        total,
        tuple(found),
        dead_count,
        pause=pause,
        workspace_pause=workspace_pause,
    )
