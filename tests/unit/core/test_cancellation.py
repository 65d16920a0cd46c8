"""A cancel lost by ``asyncio.wait_for`` (Python 3.11) is raised at a background loop's next sleep."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import pytest

from rebaser_core.nats import cancellation


async def _cancel_as_the_answer_comes(sleep: Callable[[float], Awaitable[None]]) -> asyncio.Task[None]:
    """A loop's pass: a wait for an answer (as nats-py's requests wait), then a long sleep. It is cancelled in the
    same step as the answer comes; the task is returned once it ended or 1 s has passed."""
    answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def one_pass() -> None:
        await asyncio.wait_for(answer, 10)
        await sleep(3600)

    task = asyncio.create_task(one_pass())
    await asyncio.sleep(0)  # waiting for the answer now
    answer.set_result(1)
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    return task


async def test_the_cancel_is_raised_at_the_next_sleep() -> None:
    task = await _cancel_as_the_answer_comes(cancellation.sleep)
    assert task.cancelled()


@pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="asyncio.wait_for keeps the cancel from Python 3.12 on"
)
async def test_a_plain_sleep_goes_on_as_if_never_cancelled() -> None:
    # Why the module exists: without it, the loop sleeps on (and one that only ends by a cancel never ends).
    task = await _cancel_as_the_answer_comes(asyncio.sleep)
    try:
        assert not task.done()
        assert task.cancelling() == 1
    finally:
        task.cancel()
        await asyncio.wait({task})


async def test_a_task_never_cancelled_sleeps_as_asked() -> None:
    await asyncio.wait_for(cancellation.sleep(0), 1)
    task = asyncio.create_task(cancellation.sleep(0.01))
    await asyncio.wait({task}, timeout=5)
    assert task.done() and not task.cancelled()
