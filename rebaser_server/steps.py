"""Running one app step: inline until it first waits, and in a task of its own from then on.

Every apply (and DVU run) used to get a task of its own, so that the watchdog can cancel a wedged one. Most steps
never wait for anything (the built-in apps compute in memory), and a task per request (creating it, scheduling it,
waking the caller when it ends) was a measurable share of a daemon's CPU. A step now starts inline, in a copy of
the caller's context as a task would have it; only if it suspends is the rest of it handed to a task, which the
watchdog can cancel exactly as before. A step that never suspends could not have been cancelled in its task either:
cancellation only takes effect at an ``await``.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import types
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

from rebaser_server.lease import Lease
from rebaser_server.outcome import LeaseLost

__all__ = ["Started", "Steps", "start_step"]

T = TypeVar("T")


class Started(Generic[T]):
    """A step after its first run: ``task`` is None if it finished (``result``), else the task running the rest."""

    __slots__ = ("result", "task")

    def __init__(self, result: T | None, task: asyncio.Task[T] | None) -> None:
        self.result = result
        self.task = task


class Steps:
    """The app steps of one owned change set, run under its lease, and what its watchdog needs of them: when the
    running one began, and a way to cancel it with the reason the step's caller then raises."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._running: dict[asyncio.Task[Any], float] = {}  # the task of a step that waits -> when it began
        self._cancelled_why: type[Exception] | None = None

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one app step; from its first wait on, in a task that :meth:`cancel` can stop (wedged, or the lease
        ran out)."""
        # Checked right before the app runs, with no await in between: a daemon frozen anywhere between taking a
        # request and applying it (SIGSTOP, a long GC pause) must not apply it when it resumes; the other daemon
        # that took the change set over meanwhile may be applying it.
        if not self._lease.held():
            coro.close()
            raise LeaseLost()
        began = time.monotonic()
        started = start_step(coro)
        task = started.task
        if task is None:
            result = started.result
        else:
            self._running[task] = began
            try:
                result = await task
            except asyncio.CancelledError:
                if self._cancelled_why is not None and task.cancelled():
                    raise self._cancelled_why() from None
                raise
            finally:
                self._running.pop(task, None)
        if not self._lease.held():
            # Computed partly without the lease (the loop was blocked, the process paused): discarded, never
            # committed; the next owner applies the request again.
            raise LeaseLost()
        return result  # type: ignore[return-value]

    def overran(self, now: float, deadline: float) -> bool:
        """A running step began more than ``deadline`` seconds before ``now`` (it is wedged)."""
        return any(now - began > deadline for began in self._running.values())

    def cancel(self, why: type[Exception]) -> None:
        """Cancel the running step; its caller raises ``why()``."""
        self._cancelled_why = why
        for task in list(self._running):
            task.cancel()


def start_step(coro: Coroutine[Any, Any, T]) -> Started[T]:
    """Run ``coro`` until it finishes or first suspends. An exception it raises before suspending propagates."""
    context = contextvars.copy_context()
    try:
        yielded = context.run(coro.send, None)
    except StopIteration as done:
        return Started(done.value, None)
    return Started(None, asyncio.get_running_loop().create_task(_rest(coro, yielded), context=context))


async def _rest(coro: Coroutine[Any, Any, T], yielded: Any) -> T:
    result: T = await _resume(coro, yielded)
    return result


@types.coroutine
def _resume(coro: Coroutine[Any, Any, T], yielded: Any) -> Generator[Any, Any, T]:
    """Go on with ``coro`` from where it suspended: hand what it yielded (the future it waits for) to the task
    running us, and pass back into it whatever the task sends or throws (a result, a cancellation)."""
    while True:
        try:
            sent = yield yielded
        except (
            BaseException
        ) as exc:  # thrown in by the task: its cancellation, or the awaited future's failure
            try:
                yielded = coro.throw(exc)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
