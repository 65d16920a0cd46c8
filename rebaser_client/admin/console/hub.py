"""Fan-out from the console's one set of NATS watches to every open browser: each server-sent-events connection
subscribes here, and :mod:`~rebaser_client.admin.console.live` publishes once for all of them.

A browser that does not keep up (its queue full) is not waited for: it gets ``resync`` and reloads what it shows,
so one slow tab never holds back the watches or the other tabs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["QUEUE_BOUND", "Hub", "Message", "Subscription"]

# Messages one browser may be behind before it is told to resync instead.
QUEUE_BOUND = 256


@dataclass(eq=False)
class Message:
    topic: str  # "rows", "overview", "dead-letters", "feed", or "cs:<workspace>.<change set>"
    data: Any
    # What the browsers are sent for it, rendered by the first connection that sends it and reused by the others.
    cache: dict[Any, Any] = field(default_factory=dict)


@dataclass(eq=False)
class Subscription:
    topics: frozenset[str]
    queue: asyncio.Queue[Message] = field(default_factory=lambda: asyncio.Queue(QUEUE_BOUND))
    behind: bool = False  # it missed messages: the next one it gets is a resync

    async def next(self, timeout: float) -> Message | None:
        """The next message, or None after ``timeout`` seconds without one (the caller sends a keep-alive)."""
        if self.behind:
            self.behind = False
            while not self.queue.empty():
                self.queue.get_nowait()
            return Message("resync", None)
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can turn a cancel that comes as the time runs out
        # into a TimeoutError, and a stream's handler would then go on after its browser left.
        try:
            async with asyncio.timeout(timeout):
                return await self.queue.get()
        except TimeoutError:
            return None


class Hub:
    def __init__(self) -> None:
        self._subs: set[Subscription] = set()

    def __len__(self) -> int:
        return len(self._subs)

    @contextlib.contextmanager
    def subscribe(self, *topics: str) -> Iterator[Subscription]:
        sub = Subscription(frozenset(topics))
        self._subs.add(sub)
        try:
            yield sub
        finally:
            self._subs.discard(sub)

    def close(self) -> None:
        """Every subscription gets ``close`` next, ahead of anything queued: the console is stopping, and its
        streams end now instead of at their next write."""
        for sub in self._subs:
            while not sub.queue.empty():
                sub.queue.get_nowait()
            sub.behind = False
            sub.queue.put_nowait(Message("close", None))

    def wanted(self, topic: str) -> bool:
        """Whether any browser follows ``topic`` (what nobody shows is not rendered)."""
        return any(topic in sub.topics for sub in self._subs)

    def publish(self, topic: str, data: Any) -> None:
        message = Message(topic, data)
        for sub in self._subs:
            if topic not in sub.topics or sub.behind:
                continue
            try:
                sub.queue.put_nowait(message)
            except asyncio.QueueFull:
                sub.behind = True
