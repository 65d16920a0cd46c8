"""``asyncio.timeout`` for many concurrent calls, on one timer.

Every ``asyncio.timeout`` schedules a timer of its own: a handle pushed on the event loop's heap (compared in Python),
cancelled on the way out, and the loop's clean-up of cancelled handles. For a client making one call per request
with 64 calls in flight, that is 5 to 14 µs a call (``bench/instructions.py --side client`` counts it). Here the
calls of one :class:`Deadlines` share one timer, armed for the earliest deadline: entering a deadline is a dict
insert, leaving it a dict pop, and the timer fires about once per timeout, not once per call.

The semantics are ``asyncio.timeout``'s (Python 3.11): on expiry the task is cancelled, and the ``async with``
raises ``TimeoutError`` if that cancellation is what ended the block and no other cancellation was asked for
meanwhile (``Task.uncancel``); a cancellation from outside goes through as ``CancelledError``.

The timer itself is :class:`Expiries`, which :class:`~rebaser_core.nats.requester.Requester` uses for its calls too.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Hashable
from types import TracebackType
from typing import Generic, TypeVar

__all__ = ["Deadlines", "Expiries"]

K = TypeVar("K", bound=Hashable)


class Expiries(Generic[K]):
    """When each of many pending things times out, on one timer: ``add(key, when)`` (a time on the event loop's
    clock), ``discard(key)`` once it is settled; ``on_due(key)`` is called, in the event loop, for each whose time
    came first. The timer is armed for the earliest time or later: re-armed only for an earlier one, so with one
    timeout for all it is made about once per timeout, and a pass over what is pending costs one firing."""

    def __init__(self, on_due: Callable[[K], None]) -> None:
        self._on_due = on_due
        self._when: dict[K, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's

    def __len__(self) -> int:
        return len(self._when)

    def add(self, key: K, when: float) -> None:
        """``ValueError`` for NaN: no time compares with it, and on the shared timer it would keep every other
        time from firing."""
        if math.isnan(when):
            raise ValueError("a timeout of NaN seconds")
        self._when[key] = when
        timer, loop = self._timer, asyncio.get_running_loop()
        # Also re-armed in another event loop than the timer's (a client used by one asyncio.run after another).
        if timer is None or when < timer.when() or loop is not self._loop:
            if timer is not None:
                timer.cancel()
            self._timer, self._loop = loop.call_at(when, self._fire), loop

    def discard(self, key: K) -> None:
        self._when.pop(key, None)

    def clear(self) -> list[K]:
        """Forget everything pending (no ``on_due`` for it) and return it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._when = list(self._when), {}
        return pending

    def _fire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for key in [key for key, when in self._when.items() if when <= now]:
            del self._when[key]
            self._on_due(key)
        if self._when:
            self._timer = loop.call_at(min(self._when.values()), self._fire)


class _Deadline:
    __slots__ = ("_cancelling", "_deadlines", "_expired", "_task", "when")

    def __init__(self, deadlines: Deadlines, when: float) -> None:
        self._deadlines = deadlines
        self.when = when
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._expired = False

    async def __aenter__(self) -> None:
        if self._task is not None:
            raise RuntimeError("a deadline is entered once")  # as asyncio.timeout
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._deadlines._enter(self)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._deadlines._leave(self)
        if self._expired:
            assert self._task is not None
            # As asyncio.timeout: ours was the last cancellation asked for, and it is what ended the block.
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    def _expire(self) -> None:
        assert self._task is not None
        self._expired = True
        self._task.cancel()


class Deadlines:
    """Deadlines of concurrent calls: ``async with deadlines.after(seconds):`` as ``asyncio.timeout(seconds)``."""

    def __init__(self) -> None:
        self._active: Expiries[_Deadline] = Expiries(_Deadline._expire)  # entered, not yet left or expired

    def after(self, seconds: float) -> _Deadline:
        """``asyncio.timeout(seconds)``; ``ValueError`` for NaN (see :meth:`Expiries.add`)."""
        if math.isnan(seconds):
            raise ValueError("a timeout of NaN seconds")
        return _Deadline(self, asyncio.get_running_loop().time() + seconds)

    def __len__(self) -> int:
        return len(self._active)

    def _enter(self, deadline: _Deadline) -> None:
        self._active.add(deadline, deadline.when)

    def _leave(self, deadline: _Deadline) -> None:
        self._active.discard(deadline)
