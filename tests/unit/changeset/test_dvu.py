"""The serial DVU loop: notifications during a run coalesce into exactly one more run."""

from __future__ import annotations

import asyncio

import pytest

from rebaser_core.testing import wait_for
from rebaser_server.changeset.dvu import SerialDvu


async def test_burst_during_a_run_yields_exactly_one_more_run() -> None:
    started, proceed = asyncio.Event(), asyncio.Event()
    runs = 0

    async def run() -> None:
        nonlocal runs
        runs += 1
        started.set()
        await proceed.wait()

    dvu = SerialDvu(run)
    dvu.start()
    dvu.notify()
    await asyncio.wait_for(started.wait(), 5)
    for _ in range(100):
        dvu.notify()
    proceed.set()
    await asyncio.wait_for(dvu.drain(), 5)
    assert runs == 2
    await dvu.stop()


async def test_notification_while_idle_runs_once_and_failures_do_not_stop_the_loop() -> None:
    calls = 0

    async def run() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")

    dvu = SerialDvu(run, retry_backoff=0.01)
    dvu.start()
    dvu.notify()
    await wait_for(lambda: dvu.failures == 1, timeout=5)
    dvu.notify()
    await wait_for(lambda: dvu.runs == 1, timeout=5)
    await asyncio.wait_for(dvu.drain(), 5)
    assert calls == 2 and not dvu.pending
    await dvu.stop()


async def test_drain_waits_for_pending_run() -> None:
    proceed = asyncio.Event()

    async def run() -> None:
        await proceed.wait()

    dvu = SerialDvu(run)
    dvu.notify()  # before start: the permit is stored
    assert dvu.pending
    dvu.start()
    drained = asyncio.create_task(dvu.drain())
    await asyncio.sleep(0)
    assert not drained.done()
    proceed.set()
    await asyncio.wait_for(drained, 5)
    await dvu.stop()


async def test_a_failed_update_runs_again_with_backoff_without_a_new_notification() -> None:
    calls = 0

    async def run() -> None:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise RuntimeError(f"failure {calls}")

    dvu = SerialDvu(run, retry_backoff=0.01, retry_backoff_max=0.02)
    dvu.start()
    dvu.notify()  # the only notification
    await wait_for(lambda: dvu.runs == 1, timeout=5, message="the update succeeded on its fourth try")
    await asyncio.wait_for(dvu.drain(), 5)
    assert (calls, dvu.failures) == (4, 3) and not dvu.pending
    await dvu.stop()


@pytest.mark.parametrize("notified_first", [False, True], ids=["started first", "notified first"])
async def test_the_loop_s_task_is_created_by_the_first_notification_after_start(notified_first: bool) -> None:
    ran = asyncio.Event()

    async def run() -> None:
        ran.set()

    dvu = SerialDvu(run)
    first, second = (dvu.notify, dvu.start) if notified_first else (dvu.start, dvu.notify)
    first()
    assert dvu._task is None  # a change set that never needs a DVU costs no task
    second()
    assert dvu._task is not None
    await asyncio.wait_for(ran.wait(), timeout=5)
    await dvu.stop()
