"""Running one app step: inline until it first waits, and in a task of its own from then on.

The watchdog must be able to cancel a wedged step, which a task of its own per step allows. But most steps never
wait for anything (the built-in apps compute in memory), and a task per request (creating it, scheduling it,
waking the caller when it ends) is a measurable share of a daemon's CPU. So a step starts inline, in a copy of the
caller's context as a task would have it; only if it suspends is the rest of it handed to a task, which the
watchdog can cancel as it would any task. A step that never suspends could not have been cancelled in its task either:
cancellation only takes effect at an ``await``. One difference remains: while a step runs inline,
``asyncio.current_task()`` is its caller's task, not a task of its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

from rebaser_server.app.lease import step_deadline
from rebaser_server.changeset.outcome import LeaseLost
from rebaser_server.task.lease import Lease

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
        # What the check found, for the app (lease_deadline()): the step's context is a copy of this one.
        token = step_deadline.set(self._lease.deadline())
        try:
            started = start_step(coro)
        finally:
            step_deadline.reset(token)
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
    return Started(None, asyncio.get_running_loop().create_task(_Rest(coro, yielded), context=context))


class _Rest(Coroutine[Any, Any, T]):
    """The rest of a step that suspended inline, as the coroutine of the task that runs it: the task's first step
    gets what the step yielded (the future it waits for), and every later send or throw goes to the step itself.

    A cancellation can reach the task before its first step (the watchdog, or an ``asyncio.timeout`` of the step's
    whose deadline has passed, cancels it right away). Thrown into a coroutine that has not started, it would end
    the task without the step ever seeing it; instead it is handled as ``Task.cancel`` handles a task that waits:
    the future the step waits for is cancelled, and the step sees the cancellation when that future ends (at once,
    if it cannot be cancelled)."""

    __slots__ = ("_coro", "_started", "_yielded")

    def __init__(self, coro: Coroutine[Any, Any, T], yielded: Any) -> None:
        self._coro = coro
        self._yielded = yielded
        self._started = False

    def send(self, value: Any) -> Any:
        if not self._started:
            self._started = True
            return self._yielded
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if not self._started:
            self._started = True
            if isinstance(self._yielded, asyncio.Future) and self._yielded.cancel():
                return self._yielded
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, T]:
        return self  # type: ignore[return-value]

    def __next__(self) -> Any:
        return self.send(None)
