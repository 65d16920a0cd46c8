"""An activation's first reads: whether a request is queued, and the change set's consumer once it is worth making.

Whether a request is queued (one read of the change set's last request, as the stream leader has it) is asked while
the record is read: a task with nothing to do (no record, nothing queued: anyone able to publish tasks could send
them) then costs no record write and no consumer. The change set's consumer is made as soon as a request is known
to be queued, while the record is still read and bumped (one round trip fewer before the first request); nothing is
delivered before the processor subscribes to it, after the acquire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["ColdStart"]


class ColdStart:
    def __init__(self, last_request: Awaitable[object | None], create: Callable[[], Awaitable[int]]) -> None:
        """``last_request``: the read of the change set's last request (None: it has none); ``create``: make the
        change set's consumer, answering how many requests it has to deliver."""
        self._queued = asyncio.ensure_future(self._found(last_request))
        self._create = create
        self._consumer: asyncio.Future[int] | None = None
        self._queued.add_done_callback(self._on_queued)

    @staticmethod
    async def _found(last_request: Awaitable[object | None]) -> bool:
        return await last_request is not None

    def _on_queued(self, done: asyncio.Future[bool]) -> None:
        if not done.cancelled() and done.exception() is None and done.result():
            self.consumer()

    def has_work(self) -> asyncio.Future[bool]:
        """Whether a request of the change set is in the requests stream (processed or not: a record tells)."""
        return self._queued

    def consumer(self) -> asyncio.Future[int]:
        """The change set's consumer being made (from now, if no request was known queued: it has a record)."""
        if self._consumer is None:
            self._consumer = asyncio.ensure_future(self._create())
        return self._consumer

    async def close(self) -> None:
        """Wait for what is under way (bounded by nats_timeout) and retrieve its failures: a failure to read is the
        acquire's to report, one to make the consumer the acquire's or the bind's."""
        if not self._queued.done():
            self._queued.cancel()  # (the acquire failed before it asked)
            # A task's cancel only asks: it is done (cancelled, or finished after all) once it has run again.
            await asyncio.wait({self._queued})
        if not self._queued.cancelled():
            self._queued.exception()
        consumer = self._consumer
        if consumer is not None:
            if not consumer.done():
                await asyncio.wait({consumer})  # once it exists it can be deleted
            if not consumer.cancelled():
                consumer.exception()
