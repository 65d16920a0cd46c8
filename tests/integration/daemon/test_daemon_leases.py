"""``lease_mode`` daemon: one heartbeat per daemon; a silent daemon's peers hand its tasks back, so its change sets
wait ``ack_wait``, not the tasks consumer's long ``task_ack_wait``."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from pathlib import Path
from typing import Any

import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import KeyNotFoundError

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.requester import Requester
from rebaser_core.nats.streams import open_bucket
from rebaser_core.nats.tasks import publish_task
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.daemon import liveness
from rebaser_server.record.store import ChangeSetStore
from rebaser_server.task.heartbeat import heartbeat_key
from rebaser_server.task.lease import Lease
from rebaser_server.testing import CheckpointGate, fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.daemons import daemon_processes, spawn_daemon

ENV = {
    "REBASER_STORAGE": "memory",
    "REBASER_LEASE_MODE": "daemon",
    # Far longer than the waits below: a change set served in time was handed back by a peer.
    "REBASER_TASK_ACK_WAIT": "120",
    "REBASER_ACK_WAIT": "2",
    "REBASER_PROGRESS_PERIOD": "0.5",
    "REBASER_QUIESCENT_PERIOD": "300",
}


def _owner(log: Path) -> str:
    """The daemon's owner name, from its "rebaser daemon NAME serving" log line."""
    for line in log.read_text().splitlines():
        if "rebaser daemon " in line and " serving (prefix=" in line:
            return line.split("rebaser daemon ", 1)[1].split(" serving", 1)[0]
    raise AssertionError(f"no serving line in {log}")


async def test_a_killed_daemons_change_sets_are_handed_back_by_a_peer(
    nc: NatsClient, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, change_sets = WorkspacePk.new(), [ChangeSetId.new() for _ in range(4)]
    async with daemon_processes() as procs:
        first = await spawn_daemon(nats_url, subject_prefix, tmp_path, ENV, "a")
        procs.append(first)
        for cs in change_sets:  # all four owned by the first daemon, idle, for minutes
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/n", value=1)], timeout=20
            )
            assert reply.ok, reply
        second = await spawn_daemon(nats_url, subject_prefix, tmp_path, ENV, "b")
        procs.append(second)
        kv = await nc.jetstream().key_value(Subjects(subject_prefix).daemons_bucket)
        first_key = heartbeat_key(_owner(first.log))
        await kv.get(first_key)  # it beats
        first.kill()
        await first.wait(10)
        for cs in change_sets:
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/n", value=2)], timeout=30
            )
            assert reply.ok, reply
        assert "handing its change sets back" in second.log.read_text()

        async def key_gone() -> bool:
            try:
                await kv.get(first_key)
            except KeyNotFoundError:
                return True
            return False

        await wait_for(key_gone, timeout=20, message="the dead daemon's heartbeat key removed")
        second_key = heartbeat_key(_owner(second.log))
        second.terminate()
        assert await second.wait(30) == 0
        # A clean stop takes its key along: its peers have nothing of it to hand back.
        try:
            await kv.get(second_key)
        except KeyNotFoundError:
            pass
        else:
            raise AssertionError("a cleanly stopped daemon left its heartbeat key")


async def test_a_heartbeat_bucket_not_ready_at_start_is_retried(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fresh cluster may still be electing the new bucket's leader: its first open times out. The daemon tries
    # again, as it does for the rest of its set-up, instead of exiting.
    opened: list[str] = []

    async def not_yet_then_open(js: Any, config: Any, *, create: bool) -> Any:
        opened.append(config.bucket)
        if len(opened) == 1:
            raise nats.errors.TimeoutError
        return await open_bucket(js, config, create=create)

    monkeypatch.setattr(liveness, "open_bucket", not_yet_then_open)
    settings = fast_settings(subject_prefix, lease_mode="daemon")
    client = RebaserClient(nc, prefix=subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        assert len(opened) == 2 and daemon.liveness is not None and daemon.liveness.heartbeat.held()
        assert (await daemon.status())["leases"] == {
            "mode": "daemon",
            "task_ack_wait": settings.task_ack_wait,
        }
        reply = await client.enqueue_updates_with_reply(
            WorkspacePk.new(), ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=20
        )
        assert reply.ok, reply


async def test_a_stopped_daemon_leaves_no_bucket_watch_behind(nc: NatsClient, subject_prefix: str) -> None:
    # Each KV watch (pauses, heartbeats) is a consumer on the bucket's stream: a clean stop deletes its own, and one
    # left by a killed daemon goes after 30 s (nats-py's default would keep it 5 min).
    settings = fast_settings(subject_prefix, lease_mode="daemon")
    subjects, js = settings.subjects, nc.jetstream()
    streams = [f"KV_{subjects.pauses_bucket}", f"KV_{subjects.daemons_bucket}"]
    async with running_daemon(nc, settings, RecordingApp()):
        for stream in streams:

            async def made(stream: str = stream) -> bool:  # the reaper makes its watch once it runs
                return len(await js.consumers_info(stream)) >= 1

            await wait_for(made, timeout=10, message=f"the watch on {stream} made")
            watches = await js.consumers_info(stream)
            assert len(watches) == 1, stream
            assert 0 < (watches[0].config.inactive_threshold or 0) <= 30
    for stream in streams:

        async def gone(stream: str = stream) -> bool:
            return await js.consumers_info(stream) == []

        # Deleted by the stop (the deadline is well inside the 30 s after which an abandoned watch goes by itself).
        await wait_for(gone, timeout=10, message=f"the watch on {stream} deleted")


async def test_a_stop_whose_hand_back_was_lost_leaves_its_heartbeat_for_the_peers(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The nak of a change set handed back at shutdown is lost: the task is still held. Deleting the heartbeat would
    # tell peers nothing is left, and the change set would wait task_ack_wait; left to lapse, a peer hands it back.
    settings = fast_settings(subject_prefix, lease_mode="daemon", task_ack_wait=120.0, quiescent_period=300.0)
    subjects = settings.subjects
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    async with running_daemon(nc, settings, RecordingApp()) as first:
        reply = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        assert reply.ok, reply
        assert first.liveness is not None
        key = first.liveness.heartbeat.key

        async def lost(self: Lease, delay: float | None = None) -> bool:
            return False  # never reached the server

        monkeypatch.setattr(Lease, "nak", lost)
    kv = await nc.jetstream().key_value(subjects.daemons_bucket)
    await kv.get(key)  # still there: it lapses
    monkeypatch.undo()
    async with running_daemon(nc, settings, RecordingApp()):
        reply = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=2)], timeout=20)
        assert reply.ok, reply


async def test_a_silent_peers_change_set_whose_record_cannot_be_read_is_handed_back_at_the_next_look(
    nc: NatsClient, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    # The reaper's first read of the change set's record fails: the silent peer's key must stay, so the next look
    # hands the change set back (with the key deleted it would wait task_ack_wait).
    settings = fast_settings(
        subject_prefix, lease_mode="daemon", task_ack_wait=120.0, ack_wait=2.0, quiescent_period=300.0
    )
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    async with daemon_processes() as procs:
        first = await spawn_daemon(nats_url, subject_prefix, tmp_path, ENV, "a")
        procs.append(first)
        reply = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        assert reply.ok, reply
        async with running_daemon(nc, settings, RecordingApp()) as second:
            await wait_for(lambda: second.liveness is not None and second.liveness.reaper is not None)
            assert second.liveness is not None and second.liveness.reaper is not None
            store = second.liveness.reaper._store
            mark_reaped = store.mark_reaped
            failed: list[ChangeSet] = []

            async def fails_once(change_set: ChangeSet, owner: str, **kwargs: Any) -> Any:
                if change_set == ChangeSet(wk, cs) and not failed:
                    failed.append(change_set)
                    raise nats.errors.TimeoutError
                return await mark_reaped(change_set, owner, **kwargs)

            store.mark_reaped = fails_once  # type: ignore[method-assign]
            first.kill()
            await first.wait(10)
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/n", value=2)], timeout=30
            )
            assert reply.ok, reply
            assert failed
            assert second.stats.peer_tasks_handed_back == 1


async def test_a_change_set_taken_for_the_first_time_is_handed_back_when_its_new_owner_goes_silent(
    nc: NatsClient, nats_url: str, subject_prefix: str
) -> None:
    # The first daemon takes a new change set's first task and goes silent right after acquiring it, before its
    # first commit (frozen there, its heartbeat stopped). The peer can hand back only a task whose record names its
    # owner: the record must exist from the acquire on, else the change set waits task_ack_wait.
    settings = fast_settings(
        subject_prefix, lease_mode="daemon", task_ack_wait=120.0, ack_wait=2.0, quiescent_period=300.0
    )
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    gate = CheckpointGate("acquired")
    first_nc, second_nc = await nats.connect(nats_url), await nats.connect(nats_url)
    try:
        async with running_daemon(first_nc, settings, RecordingApp(), hooks=gate) as first:
            await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=1)])
            assert await gate.wait_reached() == ChangeSet(wk, cs)
            assert first.liveness is not None
            await first.liveness.heartbeat.stop(delete=False)  # silent from now on, as if killed
            async with running_daemon(second_nc, settings, RecordingApp()) as second:
                reply = await client.enqueue_updates_with_reply(
                    wk, cs, [SetLiteral(path="/n", value=2)], timeout=30
                )
                assert reply.ok, reply
                assert second.stats.peer_tasks_handed_back == 1
            gate.release()  # the frozen owner wakes up fenced: it lets go without touching anything
    finally:
        await first_nc.close()
        await second_nc.close()


@pytest.mark.parametrize("intake", ["fair", "fifo"])
async def test_a_daemon_whose_heartbeat_lapsed_takes_no_task_until_it_beats_again(
    nc: NatsClient, subject_prefix: str, intake: str
) -> None:
    # A task taken while the heartbeat is lapsed goes straight back (it could be held under no generation): pulling
    # meanwhile would take and hand back the same task in a loop. The task must wait, untouched, for the next beat.
    settings = fast_settings(subject_prefix, lease_mode="daemon", task_ack_wait=120.0, intake=intake)
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        assert daemon.liveness is not None
        heartbeat = daemon.liveness.heartbeat
        kv = await nc.jetstream().key_value(settings.subjects.daemons_bucket)
        await heartbeat.stop(delete=False)
        await wait_for(lambda: not heartbeat.held(), timeout=10, message="the heartbeat lapsed")
        await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=1)])
        await asyncio.sleep(
            1.0
        )  # the window a loop would show in (hundreds of deliveries), not a wait for a result
        await heartbeat.start(kv, timeout=10)
        reply = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=2)], timeout=20)
        assert reply.ok, reply
        record = await daemon.store.read(ChangeSet(wk, cs))
        # Never taken in a loop (that made 129 deliveries in this window): at most once per progress period,
        # to a pull already open when the heartbeat lapsed (fifo), else not at all.
        assert record is not None and record.task_delivery < 10
        if intake == "fair":
            assert record.task_delivery == 1


async def test_a_change_set_held_when_the_heartbeat_lapses_is_handed_back_by_its_daemon(
    nc: NatsClient, subject_prefix: str
) -> None:
    # The daemon counts its heartbeat as lapsed ack_wait less the margin after its last confirmed beat; its peers reap
    # only after a full ack_wait. A lapse in between (a freeze, a slow put) made the daemon give its change sets up
    # with nobody to hand them back: they waited for task_ack_wait (120 s here). Alone, no peer ever reaps: only the
    # daemon's own hand-back serves the change set within the 20 s below. (Fair intake: the lanes keep a pull waiting
    # through the lapse, and the task handed back reaching it then goes back untaken once more, a delivery the last
    # assertion would count.)
    settings = fast_settings(
        subject_prefix, lease_mode="daemon", task_ack_wait=120.0, quiescent_period=300.0, intake="fair"
    )
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        assert daemon.liveness is not None
        heartbeat = daemon.liveness.heartbeat
        kv = await nc.jetstream().key_value(settings.subjects.daemons_bucket)
        assert (
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        ).ok
        await heartbeat.stop(delete=False)
        await wait_for(lambda: daemon.stats.leases_lost == 1, timeout=10, message="the change set given up")
        await wait_for(lambda: daemon.stats.lapse_hand_backs == 1, timeout=10, message="handed back")
        # Marked reaped by the daemon itself before its nak: a peer reaping it now leaves the task alone.
        assert await daemon.store.mark_reaped(ChangeSet(wk, cs), daemon.owner) is None
        await heartbeat.start(kv, timeout=10)
        reply = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=2)], timeout=20)
        assert reply.ok, reply
        assert daemon.stats.lapse_hand_backs == 1
        record = await daemon.store.read(ChangeSet(wk, cs))
        assert record is not None and record.task_delivery == 2  # the same task, redelivered at once


async def test_a_lapse_hand_back_that_fails_is_sent_again(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The heartbeat lapses with the cluster's trouble (a node killed), when the daemon's nak of the task it gives up
    # fails too. Tried once, the task then waited out its own lease (task_ack_wait, 120 s here) after the cluster was
    # back: 52 s stalls in the node-kill battery. It is tried again while that lease holds.
    settings = fast_settings(subject_prefix, lease_mode="daemon", task_ack_wait=120.0, quiescent_period=300.0)
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    request = Requester.request
    lost: list[str] = []

    async def lose_the_first_naks(self: Requester, subject: str, payload: bytes = b"", **kwargs: Any) -> Any:
        if payload.startswith(b"-NAK") and len(lost) < 3:
            lost.append(subject)  # never answered: the cluster is in trouble
            raise TimeoutError("the nak was lost")
        return await request(self, subject, payload, **kwargs)

    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        assert daemon.liveness is not None
        heartbeat = daemon.liveness.heartbeat
        kv = await nc.jetstream().key_value(settings.subjects.daemons_bucket)
        assert (
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        ).ok
        monkeypatch.setattr(Requester, "request", lose_the_first_naks)
        await heartbeat.stop(delete=False)
        await wait_for(lambda: daemon.stats.leases_lost == 1, timeout=10, message="the change set given up")
        await heartbeat.start(kv, timeout=10)
        await wait_for(
            lambda: daemon.stats.lapse_hand_backs == 1, timeout=20, message="handed back after all"
        )
        assert len(lost) == 3
        reply = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=2)], timeout=20)
        assert reply.ok, reply
        record = await daemon.store.read(ChangeSet(wk, cs))
        assert record is not None and record.task_delivery == 2  # the same task, redelivered at once


async def test_a_hand_back_whose_nak_fails_until_the_heartbeat_lapses_is_sent_again(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reconnect hands every owned change set back, and the naks fail with the same trouble until the heartbeat
    # lapses: tried only while the lease held, the tasks then waited out task_ack_wait (a 31 s stall in the
    # node-kill battery). They are handed back as after a lapse, while each delivery's own lease holds.
    settings = fast_settings(subject_prefix, lease_mode="daemon", task_ack_wait=120.0, quiescent_period=300.0)
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    request = Requester.request
    trouble = [True]
    lost: list[str] = []

    async def lose_naks_in_trouble(self: Requester, subject: str, payload: bytes = b"", **kwargs: Any) -> Any:
        if payload.startswith(b"-NAK") and trouble[0]:
            lost.append(subject)
            raise TimeoutError("the nak was lost")
        return await request(self, subject, payload, **kwargs)

    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        assert daemon.liveness is not None
        heartbeat = daemon.liveness.heartbeat
        kv = await nc.jetstream().key_value(settings.subjects.daemons_bucket)
        assert (
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        ).ok
        monkeypatch.setattr(Requester, "request", lose_naks_in_trouble)
        await heartbeat.stop(delete=False)
        daemon._owned.interrupt_all()  # as a reconnect does
        await wait_for(
            lambda: lost and not heartbeat.held(), timeout=20, message="naks lost, heartbeat lapsed"
        )
        trouble[0] = False
        await heartbeat.start(kv, timeout=10)
        await wait_for(
            lambda: daemon.stats.lapse_hand_backs == 1, timeout=20, message="handed back after all"
        )
        reply = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=2)], timeout=20)
        assert reply.ok, reply
        assert daemon._owned.unconfirmed_hand_backs == 0


async def test_a_release_ack_that_is_lost_is_sent_again(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A NATS node dies with the release ack (or its answer): unconfirmed, the task stayed until task_ack_wait (120 s
    # here), and the change set's next request found a task already there, held by nobody. The ack is sent again.
    settings = fast_settings(subject_prefix, lease_mode="daemon", task_ack_wait=120.0)
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    request = Requester.request
    lost: list[str] = []

    async def lose_the_first_ack(self: Requester, subject: str, payload: bytes = b"", **kwargs: Any) -> Any:
        if payload == b"+ACK" and not lost:
            lost.append(subject)  # never sent: as lost with its node
            raise TimeoutError("the ack was lost")
        return await request(self, subject, payload, **kwargs)

    monkeypatch.setattr(Requester, "request", lose_the_first_ack)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        assert (
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        ).ok
        await wait_for(lambda: daemon.stats.tasks_released == 1, timeout=10, message="released (quiescent)")
        assert lost
        reply = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=2)], timeout=20)
        assert reply.ok, reply


async def test_a_release_whose_ack_comes_after_a_heartbeat_lapse_hands_the_task_back(
    nc: NatsClient, subject_prefix: str
) -> None:
    # A daemon frozen just as a change set went quiet wakes with its heartbeat lapsed and goes on releasing it: the
    # ack is not sent (the lease no longer holds), and a request queued meanwhile found its task still there, held by
    # a delivery nobody acts on and no peer reaps (the heartbeat is back). It waited for task_ack_wait: 23 s stalls
    # in the daemon-lease freezes battery (30 s there, 120 s here). The task is handed back instead.
    settings = fast_settings(subject_prefix, lease_mode="daemon", task_ack_wait=120.0)
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    gate = CheckpointGate("stopped_consuming")
    async with running_daemon(nc, settings, RecordingApp(), hooks=gate) as daemon:
        assert daemon.liveness is not None
        heartbeat = daemon.liveness.heartbeat
        kv = await nc.jetstream().key_value(settings.subjects.daemons_bucket)
        assert (
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        ).ok
        await gate.wait_reached()  # quiet: releasing, the ack not sent yet
        await heartbeat.stop(delete=False)
        await wait_for(lambda: not heartbeat.held(), timeout=10, message="the heartbeat lapsed")
        await heartbeat.start(kv, timeout=10)  # back, in a new generation: no peer reaps
        js = nc.jetstream()
        before = (await js.stream_info(settings.subjects.requests_stream)).state.last_seq
        queued = asyncio.create_task(
            client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=2)], timeout=20)
        )

        async def published() -> bool:
            return (await js.stream_info(settings.subjects.requests_stream)).state.last_seq > before

        await wait_for(published, timeout=10, message="the second request stored (its task publish refused)")
        gate.release()
        reply = await queued
        assert reply.ok, reply
        assert daemon.stats.lapse_hand_backs == 1
        record = await daemon.store.read(ChangeSet(wk, cs))
        assert record is not None and record.task_delivery == 2  # the same task, redelivered at once


async def test_a_lapse_hand_back_leaves_a_task_a_peer_is_reaping_to_that_peer(
    nc: NatsClient, subject_prefix: str
) -> None:
    # A peer reaps a silent daemon's change set in three steps: mark the record, delete the task message, publish a
    # fresh task. The daemon, thawed, handed the same task back by a nak, which came between the mark and the delete
    # in the freezes battery: one daemon took the nacked message, another the fresh one, and both applied a request
    # at once (the first was fenced only at its commit). Here the peer's reap is held after its mark. (Fair intake:
    # the lanes keep a pull waiting through the lapse, and the fresh task reaching it then goes back untaken, a second
    # delivery that the last assertion would count.)
    settings = fast_settings(
        subject_prefix, lease_mode="daemon", task_ack_wait=120.0, quiescent_period=300.0, intake="fair"
    )
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    change_set = ChangeSet(wk, cs)
    js = nc.jetstream()
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        assert daemon.liveness is not None
        heartbeat = daemon.liveness.heartbeat
        kv = await js.key_value(settings.subjects.daemons_bucket)
        assert (
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        ).ok
        await heartbeat.stop(delete=False)
        reaping = await daemon.store.mark_reaped(change_set, daemon.owner)  # the peer's first step
        assert reaping is not None
        await wait_for(
            lambda: daemon.stats.tasks_lease_lost == 1, timeout=10, message="the change set given up"
        )
        assert daemon.stats.lapse_hand_backs == 0  # the peer's to hand back: no nak
        # The peer's other two steps.
        await js.delete_msg(settings.subjects.tasks_stream, reaping.task_seq)
        task = settings.subjects.task(wk, cs)
        assert await publish_task(nc, task)
        await heartbeat.start(kv, timeout=10)
        reply = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=2)], timeout=20)
        assert reply.ok, reply
        record = await daemon.store.read(change_set)
        assert record is not None and record.task_seq > reaping.task_seq  # the fresh task, delivered once
        assert record.task_delivery == 1


async def test_a_frozen_daemons_change_sets_are_served_by_a_peer_and_once_each_after_it_thaws(
    nc: NatsClient, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    # SIGSTOP past ack_wait: its peer hands back every change set it held, the one it was applying a request of too
    # (that request is applied once, by the peer). Thawed, it finds its heartbeat lapsed and touches none of them.
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, idle, busy = WorkspacePk.new(), [ChangeSetId.new() for _ in range(3)], ChangeSetId.new()
    sent: dict[ChangeSetId, list[str]] = {cs: [] for cs in [*idle, busy]}

    async def send(cs: ChangeSetId, *extra: SetLiteral) -> None:
        updates = [SetLiteral(path="/n", value=len(sent[cs])), *extra]
        request_id = await client.enqueue_updates(wk, cs, updates)
        sent[cs].append(str(request_id))

    async with daemon_processes() as procs:
        first = await spawn_daemon(nats_url, subject_prefix, tmp_path, ENV, "a")
        procs.append(first)
        for cs in [*idle, busy]:
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/n", value=0)], timeout=20
            )
            assert reply.ok, reply
            sent[cs].append(str(reply.id))
        second = await spawn_daemon(nats_url, subject_prefix, tmp_path, ENV, "b")
        procs.append(second)
        await send(busy, SetLiteral(path="/sleep", value=1.0))  # being applied when the daemon freezes
        store = ChangeSetStore(nc.jetstream(), Settings(prefix=subject_prefix, storage="memory"))
        await store.open()

        async def every_one_applied_in_order(what: str) -> None:
            for cs, ids in sent.items():

                async def applied(cs: ChangeSetId = cs, ids: list[str] = ids) -> bool:
                    record = await store.read(ChangeSet(wk, cs))
                    return record is not None and record.state["applied"] == ids

                await wait_for(applied, timeout=30, message=f"{cs}: {what}")

        os.kill(first.pid, signal.SIGSTOP)
        try:
            for cs in sent:
                await send(cs)
            await every_one_applied_in_order("served by the peer while the first is frozen")
        finally:
            os.kill(first.pid, signal.SIGCONT)
        await wait_for(
            lambda: "heartbeat lapsed and is back" in first.log.read_text(),
            timeout=20,
            message="the thawed daemon beats again",
        )
        for cs in sent:
            await send(cs)
        await every_one_applied_in_order("every request applied once, in order, after the thaw")
        assert "handing its change sets back" in second.log.read_text()


async def test_a_change_set_taken_under_a_heartbeat_come_back_is_not_handed_back(
    nc: NatsClient, subject_prefix: str
) -> None:
    # A peer found this daemon silent (its heartbeat at one revision) and hands back its change sets one by one;
    # meanwhile the heartbeat came back and the daemon took a change set again, under the same name. That one is the
    # daemon's own now: handed back, a peer applied beside it (two owners at once in the NATS-outage battery).
    settings = fast_settings(subject_prefix, lease_mode="daemon", task_ack_wait=120.0, quiescent_period=300.0)
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        assert daemon.liveness is not None and daemon.liveness.reaper is not None
        reaper, key = daemon.liveness.reaper, daemon.liveness.heartbeat.key
        kv = await nc.jetstream().key_value(settings.subjects.daemons_bucket)
        found_silent_at = (await kv.get(key)).revision  # what the peer saw
        assert (
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        ).ok

        async def beat_again() -> bool:
            return (await kv.get(key)).revision != found_silent_at

        await wait_for(beat_again, timeout=10, message="the heartbeat beats again")
        silent_then = functools.partial(reaper._silent, key, found_silent_at)
        assert await reaper.hand_back_tasks_of(daemon.owner, still_silent=silent_then) == 0
        record = await daemon.store.read(ChangeSet(wk, cs))
        assert record is not None and not record.reaped and record.owner == daemon.owner
        assert daemon.stats.peer_tasks_handed_back == 0
        # Silent indeed, the same call hands it back: the check above could fail.

        async def silent() -> bool:
            return True

        await reaper.hand_back_tasks_of(daemon.owner, still_silent=silent)
        assert daemon.stats.peer_tasks_handed_back == 1
