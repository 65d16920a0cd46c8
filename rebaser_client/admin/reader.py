"""What JetStream holds for one deployment, read for the operators' reports (:mod:`~rebaser_client.admin.status`,
:mod:`~rebaser_client.admin.change_set`, :mod:`~rebaser_client.admin.dead_letters`).

Read-only, and every call has a deadline (``OPERATOR_TIMEOUT``). Results are plain dataclasses; turning them into
tables or JSON is :mod:`~rebaser_client.admin.format`'s job. Lists are bounded (``limit``): a deployment may hold
millions of queued requests, and an operator's command must answer in seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError

from rebaser_client._jetstream import TaskState, delivered_upto, jetstream, task_state_upto
from rebaser_client._record import RecordView, read_record
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.bucket_watch import bucket_keys
from rebaser_core.subjects import Subjects

__all__ = ["Progress", "Reader", "StreamSummary", "no_progress"]

Progress = Callable[[int, int], None]  # (done, total): long reads report how far they are


def no_progress(done: int, total: int) -> None:
    return None


@dataclass(frozen=True)
class StreamSummary:
    name: str
    messages: int | None  # None: the stream does not exist
    bytes: int = 0
    first_seq: int = 0
    last_seq: int = 0
    consumers: int = 0
    replicas: int = 0  # 0: the stream does not exist


class Reader:
    """The reads of one deployment (or one of its shards: ``subjects``); NATS errors are left to the caller, which
    turns them into its one line (``js_error``)."""

    def __init__(self, nc: NatsClient, subjects: Subjects) -> None:
        self.nc = nc
        self.subjects = subjects
        self.js: JetStreamContext = jetstream(nc)

    async def subject_counts(self, stream: str, filter_: str) -> tuple[StreamSummary, dict[str, int]]:
        try:
            info = await self.js.stream_info(stream, subjects_filter=filter_)
        except NotFoundError:
            return StreamSummary(stream, None), {}
        state = info.state
        summary = StreamSummary(
            stream,
            state.messages,
            state.bytes,
            state.first_seq,
            state.last_seq,
            state.consumer_count,
            int(info.config.num_replicas or 1),
        )
        return summary, dict(state.subjects or {})

    async def record(self, workspace_id: str, change_set_id: str) -> RecordView | None:
        return await read_record(self.js, self.subjects, workspace_id, change_set_id)

    async def records(self) -> int | None:
        try:
            info = await self.js.stream_info(f"KV_{self.subjects.change_sets_bucket}")
        except NotFoundError:
            return None
        return int(info.state.messages)

    async def heartbeats(self) -> int | None:
        """The daemons' heartbeat keys (``lease_mode`` daemon); None if the deployment has no heartbeat bucket."""
        try:
            return len(await bucket_keys(self.js, self.subjects.daemons_bucket))
        except BucketNotFoundError:
            return None

    async def delivered_upto(self, consumer: str | None = None) -> int | None:
        """A tasks consumer's last delivered stream sequence (the shared one unless ``consumer`` is named)."""
        return await delivered_upto(self.js, self.subjects, consumer)

    async def task_state(
        self, workspace_id: WorkspacePk, change_set_id: ChangeSetId, upto: int | None
    ) -> TaskState:
        """``upto``: the shared tasks consumer's last delivered sequence, read once for every change set listed."""
        return await task_state_upto(self.js, self.subjects, workspace_id, change_set_id, upto)
