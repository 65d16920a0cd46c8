"""App steps run inline until they first wait, then in a task the watchdog can cancel
(``rebaser_server.changeset.steps``)."""

from __future__ import annotations

import asyncio
import contextvars
import time

import pytest

from rebaser_server.changeset.steps import start_step

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_steps", default="caller")


async def test_a_step_that_never_waits_needs_no_task() -> None:
    async def step() -> int:
        return 7

    started = start_step(step())
    assert started.task is None
    assert started.result == 7


async def test_a_failure_before_the_first_wait_is_raised_at_once() -> None:
    async def step() -> int:
        raise ValueError("bad request")

    with pytest.raises(ValueError, match="bad request"):
        start_step(step())


async def test_a_step_that_waits_goes_on_in_a_task_with_what_it_waits_for() -> None:
    loop = asyncio.get_running_loop()
    first: asyncio.Future[int] = loop.create_future()
    second: asyncio.Future[int] = loop.create_future()

    async def step() -> int:
        await asyncio.sleep(0)  # a bare yield
        a = await first
        b = await second
        return a + b

    started = start_step(step())
    task = started.task
    assert task is not None
    first.set_result(1)
    await asyncio.sleep(0)
    assert not task.done()
    second.set_result(2)
    assert await task == 3


async def test_a_failure_after_a_wait_is_the_task_s() -> None:
    loop = asyncio.get_running_loop()
    waited: asyncio.Future[int] = loop.create_future()

    async def step() -> int:
        return await waited

    started = start_step(step())
    assert started.task is not None
    waited.set_exception(RuntimeError("store unreachable"))
    with pytest.raises(RuntimeError, match="store unreachable"):
        await started.task


async def test_cancelling_the_task_cancels_the_step_where_it_waits() -> None:
    cleaned_up = asyncio.Event()

    async def step() -> int:
        try:
            await asyncio.Event().wait()  # wedged
        finally:
            cleaned_up.set()
        return 0

    started = start_step(step())
    task = started.task
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned_up.is_set()


async def test_a_step_sets_context_variables_in_its_own_copy_as_a_task_would() -> None:
    async def step() -> str:
        _VAR.set("step")
        await asyncio.sleep(0)
        return _VAR.get()

    started = start_step(step())
    assert _VAR.get() == "caller"
    assert started.task is not None
    assert await started.task == "step"
    assert _VAR.get() == "caller"

    async def quick() -> str:
        _VAR.set("quick")
        return _VAR.get()

    assert start_step(quick()).result == "quick"
    assert _VAR.get() == "caller"


async def test_a_cancellation_before_the_task_first_runs_reaches_the_step_and_what_it_awaits() -> None:
    """The watchdog can cancel a step's task before the task's first step (it was queued first): the step must
    still see the cancellation, and what it waits for must be cancelled too, as ``Task.cancel`` does."""
    seen: list[str] = []

    async def step() -> int:
        inner = asyncio.ensure_future(asyncio.Event().wait())
        try:
            await inner
        except asyncio.CancelledError:
            seen.append(f"step cancelled, inner cancelled: {inner.cancelled()}")
            raise
        return 0

    started = start_step(step())
    task = started.task
    assert task is not None
    task.cancel()  # before the task has run at all
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["step cancelled, inner cancelled: True"]


async def test_a_timeout_of_the_step_whose_deadline_has_passed_is_the_step_s() -> None:
    """``asyncio.timeout`` entered inline targets the caller's task; its cancel reaches the step's task before that
    task first runs, and must come out as the step's TimeoutError, not as the caller's cancellation."""

    async def step() -> str:
        try:
            async with asyncio.timeout(0):
                await asyncio.sleep(10)  # never slept: the timeout of 0 above ends it
        except TimeoutError:
            return "timed out"
        return "slept"

    async def caller() -> str:
        started = start_step(step())
        assert started.task is not None
        return await started.task

    outer = asyncio.create_task(caller())
    assert await asyncio.wait_for(outer, timeout=5) == "timed out"
    assert outer.cancelling() == 0


async def test_a_cancellation_before_the_first_run_of_a_bare_yield_reaches_the_step() -> None:
    seen: list[str] = []

    async def step() -> int:
        try:
            await asyncio.sleep(0)  # yields None: nothing to cancel but the step itself
        except asyncio.CancelledError:
            seen.append("step cancelled")
            raise
        return 0

    started = start_step(step())
    assert started.task is not None
    started.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await started.task
    assert seen == ["step cancelled"]


async def test_a_step_is_told_until_when_its_lease_was_sure_to_hold() -> None:
    """An app with a side effect outside its state can skip it once the lease it began under has run out
    (``rebaser_server.app.lease_deadline``): set in the step, inline and after its first wait; unset outside."""
    from types import SimpleNamespace

    from rebaser_server.app import lease_deadline, lease_left
    from rebaser_server.changeset.steps import Steps
    from rebaser_server.task.lease import Lease

    since = time.monotonic()
    nc, msg = SimpleNamespace(is_connected=True), SimpleNamespace(reply="$JS.ACK.t")
    lease = Lease(nc, msg, ack_wait=10.0, margin=2.0, since=since)  # type: ignore[arg-type]
    seen: list[float | None] = []

    async def step() -> float | None:
        seen.append(lease_deadline())
        await asyncio.sleep(0)  # the rest runs in a task of its own, in the same context
        seen.append(lease_deadline())
        return lease_left()

    left = await Steps(lease).run(step())
    assert seen[0] == seen[1]
    assert seen[0] is not None and abs(seen[0] - (since + 8.0)) < 0.01  # ack_wait less the margin
    assert left is not None and 7.0 < left <= 8.0
    assert lease_deadline() is None and lease_left() is None  # the caller's context is left as it was
