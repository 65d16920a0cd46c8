"""Refusing work clearly instead of buffering it: each limit answers RebaserBusy naming itself, other change sets
keep flowing, the client never holds more than max_in_flight publishes, and a full daemon leaves waiting work in
the stream."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserBusy, RebaserClient, RebaserUnavailable, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.nats.tasks import CHANGE_SET_FULL_RETRY_AFTER, STREAM_FULL_RETRY_AFTER, publish_task
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp


def one(n: int = 0) -> list[SetLiteral]:
    return [SetLiteral(path="/n", value=n)]


async def streams(nc: NatsClient, prefix: str, **limits: int) -> Settings:
    """Streams with the given limits and no daemon: nothing drains them."""
    settings = Settings(prefix=prefix, storage="memory", **limits)  # type: ignore[arg-type]
    await ensure_streams(nc.jetstream(), settings)
    return settings


async def test_stream_full_by_messages(nc: NatsClient, client: RebaserClient, subject_prefix: str) -> None:
    await streams(nc, subject_prefix, requests_max_msgs=3)
    wk = WorkspacePk.new()
    for i in range(3):
        await client.enqueue_updates(wk, ChangeSetId.new(), one(i))
    with pytest.raises(RebaserBusy) as refused:
        await client.enqueue_updates(wk, ChangeSetId.new(), one())
    assert refused.value.limit == "stream_messages"
    assert refused.value.retry_after == STREAM_FULL_RETRY_AFTER
    assert "requests stream is full (requests_max_msgs)" in str(refused.value)


async def test_stream_full_by_bytes(nc: NatsClient, client: RebaserClient, subject_prefix: str) -> None:
    await streams(nc, subject_prefix, requests_max_bytes=4096)
    wk = WorkspacePk.new()
    big = [SetLiteral(path="/blob", value="x" * 1000)]
    with pytest.raises(RebaserBusy) as refused:
        for _ in range(10):  # about three fit
            await client.enqueue_updates(wk, ChangeSetId.new(), big)
    assert refused.value.limit == "stream_bytes"
    assert refused.value.retry_after == STREAM_FULL_RETRY_AFTER
    assert "(requests_max_bytes)" in str(refused.value)


async def test_a_full_tasks_stream_is_busy_and_an_existing_task_is_not(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # nats-server answers 10077 for every discard-new limit: only "per subject" means the change set has a task.
    settings = await streams(nc, subject_prefix, tasks_max_msgs=2)
    subjects, wk = settings.subjects, WorkspacePk.new()
    first, second = subjects.task(wk, ChangeSetId.new()), subjects.task(wk, ChangeSetId.new())
    assert await publish_task(nc, first) and await publish_task(nc, second)
    assert not await publish_task(nc, first)  # it has one
    with pytest.raises(RebaserBusy) as refused:
        await publish_task(nc, subjects.task(wk, ChangeSetId.new()))
    assert refused.value.limit == "tasks_messages"
    assert "tasks stream is full (tasks_max_msgs)" in str(refused.value)
    # A client's request is stored all the same (acknowledged: the orphan sweep gives it a task once there is room).
    quiet = RebaserClient(nc, prefix=subject_prefix, publish_timeout=0.2)
    await quiet.enqueue_updates(wk, ChangeSetId.new(), one())
    info = await nc.jetstream().stream_info(subjects.requests_stream)
    assert info.state.messages == 1


async def test_change_set_full_while_others_flow(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    await streams(nc, subject_prefix, requests_max_msgs_per_change_set=2)
    wk, full = WorkspacePk.new(), ChangeSetId.new()
    await client.enqueue_updates(wk, full, one(1))
    await client.enqueue_updates(wk, full, one(2))
    with pytest.raises(RebaserBusy) as refused:
        await client.enqueue_updates(wk, full, one(3))
    assert refused.value.limit == "change_set"
    assert refused.value.retry_after == CHANGE_SET_FULL_RETRY_AFTER
    assert "this change set's backlog is full" in str(refused.value)
    for i in range(3):  # every other change set still takes work
        await client.enqueue_updates(wk, ChangeSetId.new(), one(i))


async def test_change_set_full_drains_and_accepts_again(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, requests_max_msgs_per_change_set=1)
    app = RecordingApp()
    async with running_daemon(nc, settings, app):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        await client.enqueue_updates(wk, cs, [SetLiteral(path="/sleep", value=0.3)])
        with pytest.raises(RebaserBusy) as refused:
            await client.enqueue_updates(wk, cs, one())
        assert refused.value.limit == "change_set"

        async def accepted() -> bool:
            try:
                await client.enqueue_updates(wk, cs, one())
            except RebaserBusy:
                return False
            return True

        await wait_for(accepted, timeout=10, interval=0.05, message="the change set's backlog drained")


async def test_client_bounds_publishes_in_flight(nc: NatsClient, subject_prefix: str) -> None:
    # A subscriber that never answers stands in for a stalled JetStream: every publish waits its publish_timeout.
    silent = await nc.subscribe(Settings(prefix=subject_prefix).subjects.requests_all)
    try:
        async with RebaserClient(nc, prefix=subject_prefix, max_in_flight=3, publish_timeout=0.3) as client:

            async def attempt(i: int) -> BaseException | None:
                try:
                    await client.enqueue_updates(WorkspacePk.new(), ChangeSetId.new(), one(i))
                except (RebaserBusy, RebaserUnavailable) as err:
                    return err
                return None

            attempts = asyncio.gather(*(attempt(i) for i in range(20)))
            peak = 0
            while not attempts.done():
                peak = max(peak, client.status().in_flight)
                await asyncio.sleep(0.005)
            errors = await attempts
            assert all(isinstance(e, RebaserBusy | RebaserUnavailable) for e in errors)
            assert any(isinstance(e, RebaserBusy) and e.limit == "in_flight" for e in errors)
            assert peak == 3 and client.status().in_flight == 0
    finally:
        await silent.unsubscribe()


async def test_full_daemon_leaves_waiting_work_in_the_stream(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, concurrency=2, quiescent_period=30, intake="fifo")
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk = WorkspacePk.new()
        for _ in range(5):
            await client.enqueue_updates(wk, ChangeSetId.new(), one())
        js = nc.jetstream()

        async def settled() -> bool:
            info = await js.consumer_info(settings.subjects.tasks_stream, settings.subjects.tasks_consumer)
            return len(daemon.owned) == 2 and info.num_pending == 3 and info.num_ack_pending == 2

        await wait_for(settled, timeout=10, message="two change sets owned, three tasks waiting")
        status = await daemon.status()
        assert status["owned"]["count"] == 2
        assert status["jetstream"]["tasks_waiting"] == 3 and status["jetstream"]["tasks_unacked"] == 2
        # A negative claim needs a window: longer than one fetch (1 s), so a daemon still pulling would show it.
        # (Idle change sets give way to the waiting ones after a second: the daemon turns over, never over-pulls.)
        loop = asyncio.get_running_loop()
        window_end = loop.time() + 1.5
        while loop.time() < window_end:
            info = await js.consumer_info(settings.subjects.tasks_stream, settings.subjects.tasks_consumer)
            assert info.num_ack_pending <= 2 and len(daemon.owned) <= 2
            await asyncio.sleep(0.05)  # sampling interval of the window
        await wait_for(
            lambda: daemon.stats.requests_applied == 5, timeout=20, message="all five served in turn"
        )
