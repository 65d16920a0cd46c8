"""The lanes intake against a real nats-server: the workspaces hashed onto a fixed number of lanes per shard.

The servers hold the lanes' consumers whatever the number of workspaces; a task is stored under its workspace's lane
as nats-server's subject transform computes it, which the daemons compute the same way; a newcomer in another lane is
served while a flood's backlog waits, and one in the flood's own lane too; a full daemon's idle change sets give way to
a task waiting in any lane; every request is applied once and in order across daemons; a killed daemon's change sets
come back to a peer."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.layout import LANES
from rebaser_core.nats.listing import stream_subjects
from rebaser_core.subjects import lane_of
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import GatedApp, RecordingApp
from tests.support.daemons import daemon_processes, spawn_daemon

# The tests' deployments have fast_settings' 4 lanes; the first test has the default 32.
LANES_HERE = fast_settings(None).lanes


def _in_lane(lane: int) -> WorkspacePk:
    while True:
        workspace = WorkspacePk.new()
        if lane_of(workspace, LANES_HERE) == lane:
            return workspace


async def _tasks(nc: NatsClient, stream: str) -> int:
    return (await nc.jetstream().stream_info(stream)).state.messages


async def test_tasks_are_stored_in_the_lane_the_daemons_compute_and_the_consumers_are_the_lanes(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # The default count: nats-server's partition() and the daemons' hash agree on all 32.
    settings = fast_settings(subject_prefix, intake="lanes", quiescent_period=300, lanes=LANES)
    names = settings.subjects
    workspaces = [WorkspacePk.new() for _ in range(60)]
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        assert daemon.layout.intake == "lanes"
        replies = await asyncio.gather(
            *(
                client.enqueue_updates_with_reply(
                    wk, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=20
                )
                for wk in workspaces
            )
        )
        assert all(reply.ok for reply in replies), replies
        stored = await stream_subjects(nc.jetstream(), names.tasks_stream, names.tasks_all)
        assert len(stored) == 60  # each owned change set's task, held
        for subject in stored:
            parsed = names.parse_task(subject)
            assert subject.endswith(f".{lane_of(parsed.workspace_id, LANES)}"), subject
        consumers = {c.name for c in await nc.jetstream().consumers_info(names.tasks_stream)}
        assert consumers == {names.lane_consumer(lane) for lane in range(LANES)}
        status = daemon.intake_status()
        assert status["kind"] == "lanes" and status["lanes"] == LANES and status["pulls"] > 0


async def test_a_newcomer_in_another_lane_is_served_while_a_flood_still_waits(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # Twenty slots; the flood's 40 change sets hold their requests (busy: none gives way). The flood takes every slot
    # but the one kept for others.
    settings = fast_settings(subject_prefix, concurrency=20, quiescent_period=300, intake="lanes")
    flood = _in_lane(1)
    newcomer = _in_lane(3)
    app = GatedApp()
    async with running_daemon(nc, settings, app) as daemon:
        for _ in range(40):
            await client.enqueue_updates(flood, ChangeSetId.new(), [SetLiteral(path="/gate", value=1)])
        await wait_for(
            lambda: daemon.owned_by_workspace.get(str(flood)) == 19 and app.held == 19,
            timeout=30,
            message="the flood's change sets owned, each with its request in hand",
        )
        reply = await client.enqueue_updates_with_reply(
            newcomer, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=20
        )
        assert reply.ok, reply
        assert daemon.stats.tasks_released == 0  # nobody had to let go for it
        assert daemon.owned_by_workspace == {str(flood): 19, str(newcomer): 1}
        assert await _tasks(nc, settings.subjects.tasks_stream) == 41  # the flood's 21 still wait
        app.gate.set()


async def test_a_newcomer_in_the_floods_own_lane_waits_behind_the_flood_which_does_not_go_round(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # The same, with the newcomer's task behind the flood's 21 waiting ones in the same lane: the
    # flood's next task goes back for a while, and the lane is not pulled meanwhile, so the flood's tasks are not
    # delivered and handed back over and over. The newcomer is served as the flood's change sets end.
    settings = fast_settings(subject_prefix, concurrency=20, quiescent_period=300, intake="lanes")
    flood = _in_lane(2)
    newcomer = _in_lane(2)
    app = GatedApp()
    async with running_daemon(nc, settings, app) as daemon:
        for _ in range(40):
            await client.enqueue_updates(flood, ChangeSetId.new(), [SetLiteral(path="/gate", value=1)])
        await wait_for(
            lambda: daemon.owned_by_workspace.get(str(flood)) == 19 and app.held == 19,
            timeout=30,
            message="the flood's change sets owned, each with its request in hand",
        )
        waiting = asyncio.create_task(
            client.enqueue_updates_with_reply(
                newcomer, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=30
            )
        )
        await wait_for(
            lambda: daemon.intake_status()["tasks_deferred"] >= 2,
            timeout=10,
            message="the flood's tasks deferred",
        )
        deliveries = daemon.intake_status()["tasks_deferred"]
        assert deliveries < 21  # not every waiting task of the flood went round
        app.gate.set()
        reply = await waiting
        assert reply.ok, reply


async def test_a_full_daemons_idle_change_set_gives_way_to_a_task_in_another_lane(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # Four slots (too few for a reserve), a quiet period of five minutes: four change sets fill them and go idle; a
    # newcomer's task in another lane makes one of them let go. No change set waits for an idle one.
    settings = fast_settings(subject_prefix, concurrency=4, quiescent_period=300, intake="lanes")
    flood, newcomer = _in_lane(1), _in_lane(2)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        for _ in range(4):
            await client.enqueue_updates(flood, ChangeSetId.new(), [SetLiteral(path="/n", value=1)])
        await wait_for(
            lambda: daemon.owned_by_workspace.get(str(flood)) == 4 and daemon.stats.requests_applied == 4,
            timeout=30,
            message="the flood owns every slot",
        )
        reply = await client.enqueue_updates_with_reply(
            newcomer, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=20
        )
        assert reply.ok, reply
        assert daemon.owned_by_workspace.get(str(newcomer)) == 1
        assert daemon.stats.tasks_released >= 1  # the flood's idle change set gave way


async def test_one_workspace_with_more_change_sets_than_slots_is_served_whole(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # Thirty change sets, eight slots, a quiet period of five minutes: the idle ones give way to the waiting ones of
    # their own workspace (fifo's cliff: they waited for the quiet period).
    settings = fast_settings(subject_prefix, concurrency=8, quiescent_period=300, intake="lanes")
    wk = WorkspacePk.new()
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        replies = await asyncio.gather(
            *(
                client.enqueue_updates_with_reply(
                    wk, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=30
                )
                for _ in range(30)
            )
        )
        assert all(reply.ok for reply in replies), replies
        assert daemon.stats.tasks_released >= 22  # each slot turned over, long before the quiet period


async def test_every_request_is_applied_once_and_in_order_across_two_lanes_daemons(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, concurrency=6, intake="lanes")
    workspaces = [WorkspacePk.new() for _ in range(4)]
    change_sets = [(wk, ChangeSetId.new()) for wk in workspaces for _ in range(3)]
    first_app, second_app = RecordingApp(), RecordingApp()
    async with (
        running_daemon(nc, settings, first_app) as daemon,
        running_daemon(nc, settings, second_app),
    ):

        async def caller(wk: WorkspacePk, cs: ChangeSetId) -> list[str]:
            ids = []
            for n in range(8):
                reply = await client.enqueue_updates_with_reply(
                    wk, cs, [SetLiteral(path="/n", value=n)], timeout=30
                )
                assert reply.ok, reply
                ids.append(str(reply.id))
            return ids

        sent = await asyncio.gather(*(caller(wk, cs) for wk, cs in change_sets))
        for (wk, cs), ids in zip(change_sets, sent, strict=True):
            record = await daemon.store.read(ChangeSet(wk, cs))
            assert record is not None and record.state["applied"] == ids  # once each, in the order sent
    assert not first_app.overlaps and not second_app.overlaps


async def test_a_killed_daemons_change_sets_are_served_by_a_peer(
    nc: NatsClient, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    # Nobody publishes anything when a daemon dies: the peer finds the change sets by watching the lanes whose tasks
    # are held.
    env = {
        "REBASER_STORAGE": "memory",
        "REBASER_INTAKE": "lanes",
        "REBASER_ACK_WAIT": "2",
        "REBASER_PROGRESS_PERIOD": "0.5",
        "REBASER_QUIESCENT_PERIOD": "300",
    }
    client = RebaserClient(nc, prefix=subject_prefix)
    change_sets = [(WorkspacePk.new(), ChangeSetId.new()) for _ in range(3)]
    async with daemon_processes() as procs:
        first = await spawn_daemon(nats_url, subject_prefix, tmp_path, env, "a")
        procs.append(first)
        for wk, cs in change_sets:  # owned by the first daemon, idle, for minutes
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/n", value=1)], timeout=20
            )
            assert reply.ok, reply
        second = await spawn_daemon(nats_url, subject_prefix, tmp_path, env, "b")
        procs.append(second)
        first.kill()
        await first.wait(10)
        for wk, cs in change_sets:
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/n", value=2)], timeout=30
            )
            assert reply.ok, reply
