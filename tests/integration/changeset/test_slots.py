"""A full daemon does not keep newcomers waiting: idle change sets give way when others wait for a slot, and
readiness says the daemon is full."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp


async def test_idle_change_sets_give_way_when_others_wait_for_a_slot(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # Three slots, and a quiet period far longer than the test: without pressure, the fourth change set would wait
    # the whole quiet period for one of the three to be released.
    settings = fast_settings(subject_prefix, concurrency=3, quiescent_period=300, intake="fifo")
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk = WorkspacePk.new()
        for _ in range(3):  # busy for a while, so the daemon is seen full before anything can give way
            await client.enqueue_updates(wk, ChangeSetId.new(), [SetLiteral(path="/sleep", value=4)])
        await wait_for(lambda: len(daemon.owned) == 3, timeout=10, message="three slots taken")
        newcomer = asyncio.create_task(
            client.enqueue_updates_with_reply(
                wk, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=30
            )
        )

        async def full_and_waiting() -> bool:
            status = await daemon.status()
            return not status["ready"] and any(r.startswith("full:") for r in status["not_ready"])

        await wait_for(full_and_waiting, timeout=10, message="readiness says the daemon is full")
        assert (await newcomer).ok
        assert daemon.stats.tasks_released >= 1  # an idle one let go, long before its quiet period
