"""``Deadlines.after`` behaves as ``asyncio.timeout`` (expiry, an outer cancel, nesting), with one timer for all."""

from __future__ import annotations

import asyncio
import math

import pytest

from rebaser_core.nats.deadlines import Deadlines, _Deadline


async def test_a_block_that_overruns_raises_timeout_error() -> None:
    deadlines = Deadlines()
    never = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        async with deadlines.after(0.05):
            await never
    assert len(deadlines) == 0
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]  # the cancel was taken back


async def test_a_block_that_ends_in_time_is_left_alone() -> None:
    deadlines = Deadlines()
    async with deadlines.after(5):
        await asyncio.sleep(0)
    assert len(deadlines) == 0


async def test_many_calls_each_expire_at_their_own_deadline_on_one_timer() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()  # each waiter has a future of its own: cancelling one cancels no other
    ended: dict[float, float] = {}

    async def call(seconds: float) -> None:
        began = loop.time()
        try:
            async with deadlines.after(seconds):
                await gate.wait()
        except TimeoutError:
            ended[seconds] = loop.time() - began

    # A long one arms the timer first; the shorter ones entered after it must still expire on time.
    tasks = [asyncio.create_task(call(s)) for s in (30.0, 0.3, 0.1, 0.2)]
    await asyncio.wait(tasks[1:], timeout=10)
    assert sorted(ended) == [0.1, 0.2, 0.3]
    assert all(seconds <= took < seconds + 5 for seconds, took in ended.items())
    assert not tasks[0].done() and len(deadlines) == 1  # the long one still waits
    gate.set()
    await tasks[0]
    assert len(deadlines) == 0 and 30.0 not in ended


async def test_a_cancel_from_outside_is_not_turned_into_a_timeout() -> None:
    deadlines = Deadlines()
    entered = asyncio.Event()

    async def call() -> None:
        async with deadlines.after(30):
            entered.set()
            await asyncio.get_running_loop().create_future()

    task = asyncio.create_task(call())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(deadlines) == 0


async def test_a_cancel_that_comes_with_the_expiry_stays_a_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    expire = _Deadline._expire

    def expire_and_cancel_again(deadline: _Deadline) -> None:
        expire(deadline)
        assert deadline._task is not None
        deadline._task.cancel()  # someone else cancels the task in the same turn: asyncio.timeout lets it through

    monkeypatch.setattr(_Deadline, "_expire", expire_and_cancel_again)
    deadlines = Deadlines()

    async def call() -> None:
        async with deadlines.after(0.05):
            await asyncio.get_running_loop().create_future()

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(call())


async def test_nested_with_asyncio_timeout_the_earlier_one_wins() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(30), deadlines.after(0.05):
            await loop.create_future()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05), deadlines.after(30):
            await loop.create_future()
    assert len(deadlines) == 0
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_nan_is_refused_and_a_deadline_is_entered_once() -> None:
    deadlines = Deadlines()
    with pytest.raises(ValueError, match="NaN"):
        deadlines.after(math.nan)
    deadline = deadlines.after(5)
    async with deadline:
        pass
    with pytest.raises(RuntimeError):
        async with deadline:
            pass
    assert len(deadlines) == 0
