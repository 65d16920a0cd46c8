"""Pausing a change set or a workspace against a real nats-server: nothing applied while paused, the queue kept in
order, everything applied once on resume; a pause survives a daemon restart; a request that keeps failing pauses
its change set under ``on_max_attempts = "pause"``; a workspace pause holds that workspace only.

The pauses are written to the bucket directly here (what the admin commands do is tested with them)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from nats.aio.client import Client as NatsClient
from nats.js.kv import KeyValue

from rebaser_client import RebaserClient, SetLiteral
from rebaser_client._pausing import pause_change_set, resume_change_set
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.pause_store import open_pauses
from rebaser_core.nats.tasks import publish_task
from rebaser_core.pauses import Pause, change_set_key, workspace_key
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.ops.daemon_metrics import DaemonCollector
from rebaser_server.ops.metrics import render
from rebaser_server.record.store import ChangeSetStore
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.daemons import daemon_processes, spawn_daemon


async def _bucket(nc: NatsClient, settings: Settings) -> KeyValue:
    kv = await open_pauses(nc.jetstream(), settings.subjects, create=True, storage=settings.storage)
    assert kv is not None
    return kv


async def _resume(nc: NatsClient, settings: Settings, kv: KeyValue, key: str, *targets: ChangeSet) -> None:
    await kv.delete(key)
    for cs in targets:
        await publish_task(nc, settings.subjects.task(cs.workspace_id, cs.change_set_id))


async def _applied(daemon: Daemon, cs: ChangeSet) -> list[str]:
    record = await daemon.store.read(cs)
    return [] if record is None else list(record.state["applied"])


async def test_pause_under_load_then_resume_applies_everything_once_in_order(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        kv = await _bucket(nc, settings)
        wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
        cs = ChangeSet(wk, cs_id)
        sent: list[RequestId] = []
        stop = asyncio.Event()

        async def load() -> None:
            n = 0
            while not stop.is_set():
                sent.append(await client.enqueue_updates(wk, cs_id, [SetLiteral(path="/sleep", value=0.002)]))
                n += 1
                await asyncio.sleep(0.002)  # pacing of the load, not a wait for a result

        producer = asyncio.create_task(load())
        await wait_for(lambda: len(sent) >= 30, timeout=20, message="load under way")
        await kv.put(change_set_key(wk, cs_id), Pause.now("operator", "test").encode())
        await wait_for(lambda: cs not in daemon.owned, timeout=20, message="let go once paused")
        at_pause = await _applied(daemon, cs)
        taken_while_paused = daemon.stats.tasks_paused
        # Requests keep coming and are stored; a daemon takes the change set's task and lets it go, untouched.
        await wait_for(
            lambda: daemon.stats.tasks_paused > taken_while_paused,
            timeout=20,
            message="a task taken while paused was let go",
        )
        stop.set()
        await producer
        assert await _applied(daemon, cs) == at_pause, "a request was applied while paused"
        assert len(at_pause) < len(sent)
        await _resume(nc, settings, kv, change_set_key(wk, cs_id), cs)
        await client.wait_settled(wk, cs_id, timeout=60)
        assert await _applied(daemon, cs) == [str(r) for r in sent]


async def test_a_pause_survives_a_daemon_restart(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
    cs = ChangeSet(wk, cs_id)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        kv = await _bucket(nc, settings)
        first = await client.enqueue_updates_with_reply(wk, cs_id, [], timeout=20)
        await kv.put(change_set_key(wk, cs_id), Pause.now("operator", "restart test").encode())
        await wait_for(lambda: cs not in daemon.owned, timeout=20, message="let go once paused")
        held = await client.enqueue_updates(wk, cs_id, [])
    # A new daemon: the pause is read at start-up, before any task is taken.
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        await client.enqueue_updates(wk, cs_id, [])  # a new task for the change set
        await wait_for(
            lambda: daemon.stats.tasks_paused >= 1, timeout=20, message="the task let go, untouched"
        )
        assert await _applied(daemon, cs) == [str(first.id)]
        await _resume(nc, settings, kv, change_set_key(wk, cs_id), cs)
        await client.wait_settled(wk, cs_id, timeout=30)
        assert (await _applied(daemon, cs))[:2] == [str(first.id), str(held)]


async def test_a_request_that_keeps_failing_pauses_its_change_set(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, on_max_attempts="pause", max_attempts=2)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        kv = await _bucket(nc, settings)
        wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
        cs = ChangeSet(wk, cs_id)
        # Fails its first 2 attempts (max_attempts): the change set pauses, the request first in line.
        failing = asyncio.create_task(
            client.enqueue_updates_with_reply(wk, cs_id, [SetLiteral(path="/flaky", value=2)], timeout=30)
        )
        await wait_for(
            lambda: daemon.stats.tasks_paused >= 1, timeout=20, message="paused after max_attempts"
        )
        behind = await client.enqueue_updates(wk, cs_id, [])
        reply = await failing
        assert not reply.ok and "ChangeSetPaused" in str(reply.status)
        entry = await kv.get(change_set_key(wk, cs_id))
        pause = Pause.decode(entry.value or b"")
        assert pause.cause == "max_attempts" and pause.request_id == str(reply.id)
        assert await _applied(daemon, cs) == []  # nothing behind it went ahead
        record = await daemon.store.read(cs)
        assert (
            record is not None and not record.recent
        )  # the paused reply is not remembered: it is tried again
        # Resumed: tried again (its third attempt succeeds), then the one behind it.
        await _resume(nc, settings, kv, change_set_key(wk, cs_id), cs)
        await client.wait_settled(wk, cs_id, timeout=30)
        assert await _applied(daemon, cs) == [str(reply.id), str(behind)]
        assert daemon.stats.requests_dead_lettered == 0


async def test_a_workspace_pause_holds_its_change_sets_and_no_others(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        kv = await _bucket(nc, settings)
        wk, other = WorkspacePk.new(), WorkspacePk.new()
        await kv.put(workspace_key(wk), Pause.now("operator", "migration").encode())
        await wait_for(lambda: daemon.pauses.paused(ChangeSet(wk, ChangeSetId.new())) is not None, timeout=10)
        # A change set created after the pause is held; another workspace's is served.
        new_cs = ChangeSet(wk, ChangeSetId.new())
        await client.enqueue_updates(wk, new_cs.change_set_id, [])
        served = await client.enqueue_updates_with_reply(other, ChangeSetId.new(), [], timeout=20)
        assert served.ok
        await wait_for(lambda: daemon.stats.tasks_paused >= 1, timeout=20, message="held")
        assert await _applied(daemon, new_cs) == []
        await _resume(nc, settings, kv, workspace_key(wk), new_cs)
        await client.wait_settled(wk, new_cs.change_set_id, timeout=30)
        assert len(await _applied(daemon, new_cs)) == 1


async def test_a_pause_is_shown_and_its_backlog_does_not_make_the_daemon_unready(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, ready_max_backlog=5)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        kv = await _bucket(nc, settings)
        wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
        await kv.put(change_set_key(wk, cs_id), Pause.now("operator", "inspecting").encode())
        await wait_for(lambda: daemon.pauses.counts == (1, 0), timeout=10, message="the pause seen")
        for n in range(10):  # over ready_max_backlog, all of them for the paused change set
            await client.enqueue_updates(wk, cs_id, [SetLiteral(path="/a", value=n)])

        async def backlog_counted() -> bool:
            facts, _ = await daemon.health.facts()
            return facts.requests_waiting == 10 and facts.paused_backlog == 10

        await wait_for(backlog_counted, timeout=20, message="the backlog and the paused backlog counted")
        status = await daemon.status()
        assert status["ready"], status["not_ready"]
        paused = status["paused"]
        assert (paused["change_sets"], paused["workspaces"]) == (1, 0)
        assert paused["pauses_by_cause"] == {"operator": 1}
        assert paused["held"][0]["reason"] == "inspecting"
        daemon.observe.metrics.bind(DaemonCollector(daemon))  # as the HTTP server does
        text = render(daemon.observe.metrics).decode()
        assert 'rebaser_paused{kind="change_set"} 1.0' in text
        assert 'rebaser_pauses_total{cause="operator"} 1.0' in text
        # A backlog beyond the paused one still counts against readiness.
        facts, _ = await daemon.health.facts()
        more = replace(facts, requests_waiting=16)
        assert any(
            "16 requests waiting" not in r and "6 requests waiting" in r
            for r in daemon.health.not_ready(more, False, stopping=False)
        )


async def test_pause_and_resume_are_told_to_the_change_sets_followers(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, events=True, on_max_attempts="pause", max_attempts=2)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
        cs = ChangeSet(wk, cs_id)
        async with client.watch(wk, cs_id, feed="stream") as feed:
            first = await client.enqueue_updates_with_reply(wk, cs_id, [], timeout=20)
            await pause_change_set(nc, settings.subjects, wk, cs_id, "by hand", wait=20)
            await resume_change_set(nc, settings.subjects, wk, cs_id)
            failing = await client.enqueue_updates_with_reply(
                wk, cs_id, [SetLiteral(path="/flaky", value=5)], timeout=30
            )
            seen: list[tuple[str, str | None]] = []
            while ("paused", "max_attempts") not in seen:
                event = await feed.next(20)
                seen.append((event.kind, event.reason))
        assert first.ok and not failing.ok
        # The operator's notice and the owner's letting go come from two processes, in either order.
        assert {("paused", "by hand"), ("released", "paused")} <= set(
            seen[: seen.index(("resumed", "by hand"))]
        )
        assert seen[-1] == ("paused", "max_attempts")
        # The pause notice comes before the owner's letting go finishes (it stores the pause, tells, then acks).
        await wait_for(lambda: cs not in daemon.owned, timeout=20, message="the paused change set let go")


async def test_a_pause_survives_a_sigkill_of_the_owner(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    """The owner is SIGKILLed while it holds the paused change set's next request; a new daemon process takes the
    task after ack_wait and lets it go untouched, until the resume."""
    env = {
        "REBASER_STORAGE": "memory",
        "REBASER_ACK_WAIT": "3",
        "REBASER_PROGRESS_PERIOD": "0.5",
        "REBASER_QUIESCENT_PERIOD": "30",
        "REBASER_SWEEP_INTERVAL": "1",
    }
    settings = Settings(prefix=subject_prefix, storage="memory")
    store = ChangeSetStore(nc.jetstream(), settings)
    wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
    cs = ChangeSet(wk, cs_id)
    async with daemon_processes() as procs:
        procs.append(await spawn_daemon(nats_url, subject_prefix, tmp_path, env, "first"))
        await store.open()
        first = await client.enqueue_updates_with_reply(wk, cs_id, [], timeout=20)
        await pause_change_set(nc, settings.subjects, wk, cs_id, "before the kill", wait=20)
        held = await client.enqueue_updates(wk, cs_id, [])  # its task is taken and let go, untouched
        procs[0].kill()
        await procs[0].proc.wait()
        procs.append(await spawn_daemon(nats_url, subject_prefix, tmp_path, env, "second"))
        later = await client.enqueue_updates(wk, cs_id, [])
        js = nc.jetstream()

        async def no_task_left() -> bool:
            info = await js.stream_info(settings.subjects.tasks_stream)
            return info.state.messages == 0

        await wait_for(no_task_left, timeout=30, message="the new daemon let the paused change set's task go")
        record = await store.read(cs)
        assert record is not None and record.state["applied"] == [str(first.id)]
        await resume_change_set(nc, settings.subjects, wk, cs_id)
        await client.wait_settled(wk, cs_id, timeout=30)
        record = await store.read(cs)
        assert record is not None and record.state["applied"] == [str(first.id), str(held), str(later)]
