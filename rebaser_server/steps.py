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
import types
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

__all__ = ["Started", "start_step"]

T = TypeVar("T")


class Started(Generic[T]):
    """A step after its first run: ``task`` is None if it finished (``result``), else the task running the rest."""

    __slots__ = ("result", "task")

    def __init__(self, result: T | None, task: asyncio.Task[T] | None) -> None:
        self.result = result
        self.task = task


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
