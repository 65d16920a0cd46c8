"""The fair intake against a real nats-server: each workspace's tasks in a consumer of their own, served in turns.

A newcomer is served while a flood's backlog still waits, without waiting for the flood's change sets to let go;
every request is still applied once and in order, across daemons; a killed daemon's change sets come back to a
peer; and a layout's intake is fixed when the layout is made."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.api import ENQUEUE_UPDATES_REQUEST, EnqueueUpdatesRequest, InlineUpdates
from rebaser_core.errors import LayoutMismatch
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.streams import WORKSPACE_CONSUMER_IDLE, ensure_streams
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.intake import fair_intake, fair_line
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.daemons import daemon_processes, spawn_daemon


async def _tasks(nc: NatsClient, stream: str) -> int:
    return (await nc.jetstream().stream_info(stream)).state.messages


async def test_a_newcomer_is_served_while_a_flood_still_waits_and_nothing_of_the_flood_lets_go(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # Twenty slots, a quiet period far longer than the test: nothing lets go by itself. The flood's 40 change sets
    # are queued before the daemon starts (found in the stream, not seen published). With one consumer in stream
    # order the newcomer's task would wait behind the 21 the daemon cannot take, until some of the flood gave way.
    settings = fast_settings(subject_prefix, concurrency=20, quiescent_period=300, intake="fair")
    await ensure_streams(nc.jetstream(), settings, consumer=False)
    flood, newcomer = WorkspacePk.new(), WorkspacePk.new()
    for _ in range(40):
        await client.enqueue_updates(flood, ChangeSetId.new(), [SetLiteral(path="/n", value=1)])
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        # The flood takes every slot but the one kept for others (a twentieth of them).
        await wait_for(
            lambda: daemon.owned_by_workspace.get(str(flood)) == 19,
            timeout=30,
            message="the flood's change sets owned",
        )
        reply = await client.enqueue_updates_with_reply(
            newcomer, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=20
        )
        assert reply.ok, reply
        assert daemon.stats.tasks_released == 0  # nobody had to let go for it
        assert daemon.owned_by_workspace == {str(flood): 19, str(newcomer): 1}
        assert await _tasks(nc, settings.subjects.tasks_stream) == 41  # the flood's 21 still wait


async def test_a_full_daemon_lets_the_busiest_workspaces_idle_change_set_go_for_a_newcomer(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # Four slots (too few for a reserve): the flood fills them; a newcomer's task makes one of them let go, within the
    # test although the quiet period is five minutes.
    settings = fast_settings(subject_prefix, concurrency=4, quiescent_period=300, intake="fair")
    flood, newcomer = WorkspacePk.new(), WorkspacePk.new()
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        for _ in range(10):
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


async def test_every_request_is_applied_once_and_in_order_across_two_fair_daemons(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, concurrency=6, intake="fair")
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
                ids.append(str(reply.id))  # a reply carries its request's id
            return ids

        sent = await asyncio.gather(*(caller(wk, cs) for wk, cs in change_sets))
        for (wk, cs), ids in zip(change_sets, sent, strict=True):
            record = await daemon.store.read(ChangeSet(wk, cs))
            assert record is not None and record.state["applied"] == ids  # once each, in the order sent
    assert not first_app.overlaps and not second_app.overlaps


async def test_a_killed_daemons_change_sets_are_served_by_a_peer(
    nc: NatsClient, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    # Nobody publishes anything when a daemon dies: the peer finds the change sets by watching the workspace's
    # consumer while its tasks are held.
    env = {
        "REBASER_STORAGE": "memory",
        "REBASER_INTAKE": "fair",
        "REBASER_ACK_WAIT": "2",
        "REBASER_PROGRESS_PERIOD": "0.5",
        "REBASER_QUIESCENT_PERIOD": "300",
    }
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, change_sets = WorkspacePk.new(), [ChangeSetId.new() for _ in range(3)]
    async with daemon_processes() as procs:
        first = await spawn_daemon(nats_url, subject_prefix, tmp_path, env, "a")
        procs.append(first)
        for cs in change_sets:  # owned by the first daemon, idle, for minutes
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/n", value=1)], timeout=20
            )
            assert reply.ok, reply
        second = await spawn_daemon(nats_url, subject_prefix, tmp_path, env, "b")
        procs.append(second)
        first.kill()
        await first.wait(10)
        for cs in change_sets:
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/n", value=2)], timeout=30
            )
            assert reply.ok, reply


async def test_a_task_handed_back_for_a_retry_is_taken_again_without_a_look(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failed attempt hands the task back with a short delay: nothing is published, and here the watch looks
    # only every 30 s (half of ack_wait) and the stream's workspaces are read only at start. The workspace joins
    # the line again when its task is ready.
    monkeypatch.setattr(fair_line, "_DISCOVER_EVERY", 3600.0)
    settings = fast_settings(subject_prefix, intake="fair", ack_wait=60.0)
    app = RecordingApp()
    async with running_daemon(nc, settings, app) as daemon:
        reply = await client.enqueue_updates_with_reply(
            WorkspacePk.new(), ChangeSetId.new(), [SetLiteral(path="/flaky", value=1)], timeout=20
        )
        assert reply.ok, reply
        assert app.attempts[str(reply.id)] == 2
        assert daemon.stats.tasks_retried >= 1


async def test_a_new_deployment_has_lanes_and_a_daemon_asking_for_another_intake_is_refused(
    nc: NatsClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon:
        assert daemon.layout.intake == "lanes"
    with pytest.raises(LayoutMismatch, match="--intake fifo"):
        async with running_daemon(nc, fast_settings(subject_prefix, intake="fifo"), RecordingApp()):
            pass


async def test_an_idle_shared_consumer_on_a_fair_shard_is_removed(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # Made by a script (or a daemon of an older version) on a deployment whose layout says fair: it overlaps every
    # workspace's consumer. Holding no task, it goes; the request is served.
    settings = fast_settings(subject_prefix, intake="fair")
    await ensure_streams(nc.jetstream(), settings)  # the shared consumer too
    async with running_daemon(nc, settings, RecordingApp()):
        reply = await client.enqueue_updates_with_reply(
            WorkspacePk.new(), ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=20
        )
        assert reply.ok, reply
        names = {c.name for c in await nc.jetstream().consumers_info(settings.subjects.tasks_stream)}
        assert settings.subjects.tasks_consumer not in names


async def test_a_workspace_idle_for_longer_than_its_consumer_lives_is_forgotten_and_served_again(
    nc: NatsClient, subject_prefix: str
) -> None:
    # The workspaces a daemon knows (made or pulled a consumer of) were kept for as long as it ran: a daemon of a
    # deployment where workspaces come and go grew for ever. One idle for longer than its consumer lives goes.
    settings = fast_settings(subject_prefix, intake="fair", quiescent_period=300.0)
    client = RebaserClient(nc, prefix=subject_prefix)
    wk = WorkspacePk.new()
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        cs = ChangeSetId.new()
        first = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        assert first.ok, first
        intake = daemon.intakes.of(0)
        assert intake is not None  # it served the request
        later = time.monotonic() + WORKSPACE_CONSUMER_IDLE + 1
        intake._forget_idle(later)
        assert wk in intake._known  # its change set is held: watched, never forgotten
        await client.pause_change_set(wk, cs, wait=20)  # let go: nothing of it held any more

        async def forgotten() -> bool:
            intake._forget_idle(time.monotonic() + WORKSPACE_CONSUMER_IDLE + 1)
            return (
                wk not in intake._known and wk not in intake._pullers
            )  # its puller too: none kept per workspace

        await wait_for(forgotten, timeout=30, message="the idle workspace forgotten")
        # Back after that: a newcomer again, served.
        reply = await client.enqueue_updates_with_reply(
            wk, ChangeSetId.new(), [SetLiteral(path="/n", value=2)]
        )
        assert reply.ok, reply
        assert wk in intake._known
        # A turn of a workspace whose consumer is gone keeps no puller of it either (one stayed per such workspace).
        gone = WorkspacePk.new()
        assert not await intake._take_from(gone, 1)
        assert gone not in intake._pullers and gone not in intake._known


async def test_a_task_heard_before_the_stream_has_it_is_found_by_another_look(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemon hears a task's publish as the stream does, and its turn may pull before the stream has stored the
    # task: that turn finds nothing. Made certain here: the publish heard is one the stream refuses, and the task
    # then stored is not heard. Only the watch (every 30 s here) or another look finds it; the turn is given again
    # a few milliseconds later (fair_line._FRESH_LOOKS), so the first reply does not wait for the watch.
    monkeypatch.setattr(fair_line, "_DISCOVER_EVERY", 3600.0)
    settings = fast_settings(subject_prefix, intake="fair", ack_wait=60.0, sweep_interval=3600.0)
    names = settings.subjects
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    target = names.task(wk, cs)
    heard: list[str] = []
    original = fair_intake.FairIntake._on_task

    def on_task(self: fair_intake.FairIntake, msg: object) -> None:
        subject = getattr(msg, "subject", "")
        if subject == target:
            heard.append(subject)
            if len(heard) > 1:
                return  # the task the stream stored: not heard
        original(self, msg)  # type: ignore[arg-type]

    monkeypatch.setattr(fair_intake.FairIntake, "_on_task", on_task)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        # The workspace is known (its consumer made) and its first change set served.
        first = await client.enqueue_updates_with_reply(
            wk, ChangeSetId.new(), [SetLiteral(path="/n", value=0)]
        )
        assert first.ok, first
        intake = daemon.intakes.of(0)
        assert intake is not None
        applied, empty = daemon.stats.requests_applied, intake.empty_turns
        # The request is stored; its task's publish is heard, but the stream refuses it (a wrong expected sequence).
        request = EnqueueUpdatesRequest(
            id=RequestId.new(),
            workspace_id=wk,
            change_set_id=cs,
            updates=InlineUpdates(updates=[SetLiteral(path="/n", value=1)]),
        )
        headers, body = ENQUEUE_UPDATES_REQUEST.encode(request)
        await nc.jetstream().publish(
            names.requests(wk, cs), body, headers=headers, stream=names.requests_stream
        )
        await nc.publish(target, b"", headers={"Nats-Expected-Last-Subject-Sequence": "999999"})
        await wait_for(lambda: intake.empty_turns > empty, timeout=10, message="the turn finds nothing")
        await nc.jetstream().publish(target, b"")  # stored, not heard
        await wait_for(
            lambda: daemon.stats.requests_applied > applied,
            timeout=20,
            message="the task found by another look",
        )
        assert len(heard) == 2 and intake.fresh_looks >= 1
