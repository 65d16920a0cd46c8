"""A flood of tasks for made-up change sets (no request behind any of them) at a live daemon.

Anyone able to publish tasks can send them. Each made-up workspace is found with no request and no consumer, and its
tasks are dropped untaken: no consumer made for it, no record read or written. Meanwhile another workspace's
awaited requests are all answered, and the tasks stream ends empty. The CI version sends 3,000 (one made-up
workspace, and a hundred more); ``make chaos`` (the ``slow`` mark) sends 100,000. How fast the other workspace is
served meanwhile is measured by ``python -m bench.fair_share --runs fair-alone,bogus`` (docs/fair-share.md), not
asserted here.
"""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp


async def _bogus_flood(nc: NatsClient, client: RebaserClient, subject_prefix: str, count: int) -> None:
    settings = fast_settings(
        subject_prefix, storage="file", intake="fair"
    )  # lanes: taken, see test_hostile_subjects
    subjects, js = settings.subjects, nc.jetstream()
    consumers: list[Msg] = []

    async def announced(msg: Msg) -> None:
        consumers.append(msg)

    advisories = await nc.subscribe(
        f"$JS.EVENT.ADVISORY.CONSUMER.CREATED.{subjects.requests_stream}.*", cb=announced
    )
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        flooder, others = WorkspacePk.new(), [WorkspacePk.new() for _ in range(100)]
        canary, canary_sets = WorkspacePk.new(), [ChangeSetId.new() for _ in range(3)]
        flooding = asyncio.Event()
        flooding.set()
        answered = 0

        async def canary_traffic(cs: ChangeSetId) -> None:
            nonlocal answered
            n = 0
            while flooding.is_set():
                reply = await client.enqueue_updates_with_reply(
                    canary, cs, [SetLiteral(path="/n", value=n)], timeout=60
                )
                assert reply.ok, reply
                answered += 1
                n += 1

        callers = [asyncio.create_task(canary_traffic(cs)) for cs in canary_sets]
        # Plain publishes, not waiting for acks, as a hostile caller would: most to one made-up workspace, a
        # tenth spread over a hundred more (each a workspace the fair intake has never seen).
        for i in range(count):
            wk = others[i % len(others)] if i % 10 == 0 else flooder
            await nc.publish(subjects.task(wk, ChangeSetId.new()), b"")
            if i % 1000 == 999:
                await nc.flush()
        await nc.flush()

        async def tasks_left() -> int:
            return (
                await js.stream_info(subjects.tasks_stream, subjects_filter=subjects.tasks_all)
            ).state.messages

        async def only_the_canarys_tasks_left() -> bool:
            info = await js.stream_info(subjects.tasks_stream, subjects_filter=subjects.tasks_all)
            return all(f".{canary}." in subject for subject in info.state.subjects or {})

        await wait_for(
            only_the_canarys_tasks_left,
            timeout=max(60, count / 100),
            interval=0.5,
            message="every bogus task dropped",
        )
        flooding.clear()
        await asyncio.gather(*callers)
        await advisories.unsubscribe()

        assert answered >= len(canary_sets)
        # Dropped untaken: each made-up workspace was found with no request and no consumer (newcomers.py).
        assert daemon.intake_status()["empty_tasks_dropped"] == count
        assert daemon.stats.tasks_dropped == 0
        # The records' keys as the server counts them (nats-py's kv.keys() can end its scan before the first key
        # arrives and answer NoKeysError: seen once under load).
        records = await js.stream_info(subjects.records_stream, subjects_filter=subjects.records_all)
        workspaces = {subject.split(".")[2] for subject in records.state.subjects or {}}
        assert workspaces == {str(canary)}  # no record for a made-up change set
        # Only the canary's activations made a request consumer; only the canary's workspace has a tasks consumer.
        assert 0 < len(consumers) <= daemon.stats.tasks_taken
        tasks_consumers = [info.name for info in await js.consumers_info(subjects.tasks_stream)]
        assert tasks_consumers == [subjects.workspace_tasks_consumer(canary)]
        assert await tasks_left() <= len(canary_sets)
        print(
            f"\nbogus tasks: {count} dropped, the canary answered {answered} requests, "
            f"{len(consumers)} request consumers made (all the canary's)"
        )


async def test_a_flood_of_bogus_tasks_smoke(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    await _bogus_flood(nc, client, subject_prefix, 3_000)


@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_a_flood_of_100000_bogus_tasks(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    await _bogus_flood(nc, client, subject_prefix, 100_000)
