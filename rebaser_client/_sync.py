"""A thin synchronous wrapper for scripts: the async client on a private event loop in a background thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from rebaser_client._arguments import Updates
from rebaser_client._client import RebaserClient
from rebaser_client._events import EventStream, Feed
from rebaser_client._publisher import ClientStatus
from rebaser_core.api import (
    ChangeSetEvent,
    EnqueueUpdatesResponse,
    ForkChangeSetResponse,
    GetChangeSetResponse,
    StoredUpdates,
    Update,
    WaitSettledResponse,
    WorkspaceBacklogResponse,
)
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.connect import ConnectOptions

if TYPE_CHECKING:
    from rebaser_client._pausing import PauseResult, ResumeResult
    from rebaser_client._skipping import SkipResult
    from rebaser_core.pauses import Pause

__all__ = ["SyncEventStream", "SyncRebaserClient"]

T = TypeVar("T")


class SyncRebaserClient:
    """``with SyncRebaserClient("nats://127.0.0.1:4222") as client: client.enqueue_updates_with_reply(...)``."""

    def __init__(self, options: ConnectOptions | str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rebaser-client", daemon=True)
        self._thread.start()
        try:
            self._client = self._run(RebaserClient.connect(options, **kwargs))
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def close(self) -> None:
        if not self._loop.is_closed():
            self._run(self._client.close())
            self._stop_loop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def status(self) -> ClientStatus:
        return self._run(self._status())

    async def _status(self) -> ClientStatus:
        return self._client.status()  # read on the client's own loop: its state is not thread-safe

    def enqueue_updates(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        updates: Updates,
        **kwargs: Any,
    ) -> RequestId:
        return self._run(self._client.enqueue_updates(workspace_id, change_set_id, updates, **kwargs))

    def enqueue_updates_with_reply(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        updates: Updates,
        **kwargs: Any,
    ) -> EnqueueUpdatesResponse:
        return self._run(
            self._client.enqueue_updates_with_reply(workspace_id, change_set_id, updates, **kwargs)
        )

    def enqueue_updates_from_change_set(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        from_change_set_id: ChangeSetId | str,
        **kwargs: Any,
    ) -> RequestId:
        return self._run(
            self._client.enqueue_updates_from_change_set(
                workspace_id, change_set_id, from_change_set_id, **kwargs
            )
        )

    def enqueue_updates_from_change_set_with_reply(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        from_change_set_id: ChangeSetId | str,
        **kwargs: Any,
    ) -> EnqueueUpdatesResponse:
        return self._run(
            self._client.enqueue_updates_from_change_set_with_reply(
                workspace_id, change_set_id, from_change_set_id, **kwargs
            )
        )

    def get_change_set(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        path: str | None = None,
        **kwargs: Any,
    ) -> GetChangeSetResponse:
        return self._run(self._client.get_change_set(workspace_id, change_set_id, path, **kwargs))

    def fork_change_set(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        from_change_set_id: ChangeSetId | str,
        **kwargs: Any,
    ) -> ForkChangeSetResponse:
        return self._run(
            self._client.fork_change_set(workspace_id, change_set_id, from_change_set_id, **kwargs)
        )

    def wait_settled(
        self, workspace_id: WorkspacePk | str, change_set_id: ChangeSetId | str, **kwargs: Any
    ) -> WaitSettledResponse:
        return self._run(self._client.wait_settled(workspace_id, change_set_id, **kwargs))

    def workspace_backlog(self, workspace_id: WorkspacePk | str, **kwargs: Any) -> WorkspaceBacklogResponse:
        return self._run(self._client.workspace_backlog(workspace_id, **kwargs))

    def store_batch(
        self, workspace_id: WorkspacePk | str, updates: list[Update], **kwargs: Any
    ) -> StoredUpdates:
        return self._run(self._client.store_batch(workspace_id, updates, **kwargs))

    # -- operators: pausing (RebaserClient's methods) -------------------------------------------------
    def pause_change_set(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        reason: str = "",
        **kwargs: Any,
    ) -> PauseResult:
        return self._run(self._client.pause_change_set(workspace_id, change_set_id, reason, **kwargs))

    def resume_change_set(
        self, workspace_id: WorkspacePk | str, change_set_id: ChangeSetId | str
    ) -> ResumeResult:
        return self._run(self._client.resume_change_set(workspace_id, change_set_id))

    def pause_workspace(
        self, workspace_id: WorkspacePk | str, reason: str = "", **kwargs: Any
    ) -> PauseResult:
        return self._run(self._client.pause_workspace(workspace_id, reason, **kwargs))

    def resume_workspace(self, workspace_id: WorkspacePk | str) -> ResumeResult:
        return self._run(self._client.resume_workspace(workspace_id))

    def skip_request(
        self, workspace_id: WorkspacePk | str, change_set_id: ChangeSetId | str, request_id: RequestId | str
    ) -> SkipResult:
        return self._run(self._client.skip_request(workspace_id, change_set_id, request_id))

    def pause_of(
        self, workspace_id: WorkspacePk | str, change_set_id: ChangeSetId | str
    ) -> tuple[Pause | None, Pause | None]:
        return self._run(self._client.pause_of(workspace_id, change_set_id))

    def watch(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str | None = None,
        *,
        since: int | Mapping[ChangeSetId, int] | None = None,
        feed: Feed = "records",
    ) -> SyncEventStream:
        """``RebaserClient.watch``: ``for event in client.watch(wk, cs): ...`` (``with`` it, or ``close()``)."""
        return SyncEventStream(self, self._client.watch(workspace_id, change_set_id, since=since, feed=feed))


class SyncEventStream:
    """The events of ``SyncRebaserClient.watch``, read on the client's loop."""

    def __init__(self, client: SyncRebaserClient, stream: EventStream) -> None:
        self._client, self._stream = client, stream

    def __iter__(self) -> Iterator[ChangeSetEvent]:
        return self

    def __next__(self) -> ChangeSetEvent:
        try:
            return self._client._run(self._stream.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def next(self, timeout: float) -> ChangeSetEvent:
        """The next event, or ``TimeoutError`` after ``timeout`` seconds."""
        return self._client._run(self._stream.next(timeout))

    def resume_points(self) -> dict[ChangeSetId, int]:
        """Each change set's last durable seq seen: ``since`` for a watch that goes on from here."""
        return self._stream.resume_points()

    @property
    def malformed(self) -> int:
        return self._stream.malformed

    def close(self) -> None:
        self._client._run(self._stream.close())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
