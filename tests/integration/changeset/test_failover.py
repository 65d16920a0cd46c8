"""Daemons in their own processes: SIGKILL mid-request loses nothing and applies nothing twice; SIGTERM hands
owned change sets over at once, well before ack_wait."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.record.store import ChangeSetStore
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.daemons import daemon_processes, read_record, spawn_daemon

ENV = {
    "REBASER_STORAGE": "memory",
    "REBASER_ACK_WAIT": "3",
    "REBASER_PROGRESS_PERIOD": "0.5",
    "REBASER_QUIESCENT_PERIOD": "0.5",
    "REBASER_SWEEP_INTERVAL": "1",
    "REBASER_RETRY_BACKOFF": "0.1",
}


async def test_sigkill_mid_request_loses_nothing_and_applies_nothing_twice(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    env = {**ENV, "REBASER_TEST_RECORD": str(record)}
    settings = fast_settings(subject_prefix)
    store = ChangeSetStore(nc.jetstream(), settings)
    async with daemon_processes() as daemons:
        daemons.append(await spawn_daemon(nats_url, subject_prefix, tmp_path, env, "a"))
        daemons.append(await spawn_daemon(nats_url, subject_prefix, tmp_path, env, "b"))
        await store.open()
        wk = WorkspacePk.new()
        change_sets = [ChangeSetId.new() for _ in range(6)]
        sent: dict[ChangeSetId, list[str]] = {cs: [] for cs in change_sets}
        slow = [SetLiteral(path="/sleep", value=0.05)]

        async def produce(cs: ChangeSetId) -> None:
            for _ in range(12):
                sent[cs].append(str(await client.enqueue_updates(wk, cs, slow)))

        producing = asyncio.gather(*(produce(cs) for cs in change_sets))
        # Kill whichever daemon is in the middle of a request (a "start" without its "end").
        victim_pid = await wait_for(
            lambda: _mid_request(read_record(record)), timeout=20, message="a request started"
        )
        victim = next(d for d in daemons if d.pid == victim_pid)
        victim.kill()
        await victim.wait(10)
        await producing
        for cs in change_sets:
            final = await client.enqueue_updates_with_reply(wk, cs, [], timeout=30)
            assert final.ok
            sent[cs].append(str(final.id))

        for cs in change_sets:
            record_ = await store.read(ChangeSet(wk, cs))
            assert record_ is not None
            assert record_.state["applied"] == sent[cs], f"{cs}: lost, duplicated or reordered"
        survivors = {e["pid"] for e in read_record(record) if e["e"] == "end"}
        assert survivors - {victim_pid}, "the surviving daemon took over"


def _mid_request(events: list[dict[str, object]]) -> int | None:
    open_: dict[tuple[object, object], object] = {}
    for e in events:
        key = (e["pid"], e["rid"])
        if e["e"] == "start":
            open_[key] = e["pid"]
        else:
            open_.pop(key, None)
    return next(iter(open_.values()), None)  # type: ignore[return-value]


async def test_sigterm_hands_change_sets_over_before_ack_wait(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    # The owner would hold its change sets for a minute and a silent owner would lose them only after 30 s.
    env = {
        **ENV,
        "REBASER_ACK_WAIT": "30",
        "REBASER_PROGRESS_PERIOD": "5",
        "REBASER_QUIESCENT_PERIOD": "60",
        "REBASER_TEST_RECORD": str(tmp_path / "record.jsonl"),
    }
    async with daemon_processes() as daemons:
        first = await spawn_daemon(nats_url, subject_prefix, tmp_path, env, "first")
        daemons.append(first)
        wk = WorkspacePk.new()
        change_sets = [ChangeSetId.new() for _ in range(4)]
        for cs in change_sets:
            assert (await client.enqueue_updates_with_reply(wk, cs, [], timeout=10)).ok
        settings = fast_settings(subject_prefix, ack_wait=30, progress_period=5, quiescent_period=60)
        async with running_daemon(nc, settings, RecordingApp()) as second:
            started = time.monotonic()
            first.terminate()
            assert await first.wait(15) == 0
            replies = await asyncio.gather(
                *(client.enqueue_updates_with_reply(wk, cs, [], timeout=10) for cs in change_sets)
            )
            handover = time.monotonic() - started
            assert all(r.ok for r in replies)
            assert sorted(map(str, second.owned)) == sorted(str(ChangeSet(wk, cs)) for cs in change_sets)
            assert handover < 15, f"handover took {handover:.1f}s"
        log = first.log.read_text()
        assert "stopped" in log


async def test_second_signal_exits_at_once(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    env = {**ENV, "REBASER_SHUTDOWN_GRACE": "60", "REBASER_TEST_RECORD": str(record)}
    async with daemon_processes() as daemons:
        daemon = await spawn_daemon(nats_url, subject_prefix, tmp_path, env, "slow")
        daemons.append(daemon)
        await client.enqueue_updates(
            WorkspacePk.new(), ChangeSetId.new(), [SetLiteral(path="/sleep", value=60)]
        )
        await wait_for(lambda: _mid_request(read_record(record)), timeout=10, message="a request in hand")
        daemon.terminate()  # graceful: would wait up to 60 s for the request in hand
        await wait_for(
            lambda: b"shutting down" in daemon.log.read_bytes(), timeout=10, message="first signal seen"
        )
        daemon.terminate()
        assert await daemon.wait(5) == 1
