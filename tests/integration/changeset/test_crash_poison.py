"""A request that kills (or freezes) every daemon that applies it is dead-lettered after ``max_attempts`` deaths with
it in hand (after the first, which nothing shows was its); the requests behind it are served. And with the default
settings a dead daemon's change sets are served again within a few seconds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core import headers as h
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_server.record.store import ChangeSetStore
from tests.support.apps import applied
from tests.support.daemons import DaemonProcess, daemon_processes, spawn_daemon

ENV = {
    "REBASER_STORAGE": "memory",
    "REBASER_ACK_WAIT": "2",
    "REBASER_PROGRESS_PERIOD": "0.5",
    "REBASER_QUIESCENT_PERIOD": "0.5",
    "REBASER_SWEEP_INTERVAL": "1",
    "REBASER_MAX_ATTEMPTS": "2",
}


async def _keep_one_alive(procs: list[DaemonProcess], spawn: object, stop: asyncio.Event) -> int:
    """Respawn the daemon each time it dies; return how many times it died."""
    deaths = 0
    while not stop.is_set():
        live = procs[-1]
        waits = {asyncio.ensure_future(live.proc.wait()), asyncio.ensure_future(stop.wait())}
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for waiting in pending:
            waiting.cancel()
        if live.proc.returncode is not None and not stop.is_set():
            deaths += 1
            await spawn()  # type: ignore[operator]
    return deaths


@pytest.mark.parametrize("lease_mode", ["task", "daemon"])
async def test_a_request_that_kills_the_daemon_is_dead_lettered(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str, tmp_path: Path, lease_mode: str
) -> None:
    # lease_mode daemon: each restarted daemon hands back its predecessor's task (a new task message); the takeover
    # still counts an attempt.
    settings = Settings(prefix=subject_prefix)
    env = {**ENV, "REBASER_LEASE_MODE": lease_mode, "REBASER_TASK_ACK_WAIT": "120"}
    async with daemon_processes() as procs:
        names = iter(range(100))

        async def spawn() -> None:
            procs.append(await spawn_daemon(nats_url, subject_prefix, tmp_path, env, f"d{next(names)}"))

        await spawn()
        stop = asyncio.Event()
        keeper = asyncio.create_task(_keep_one_alive(procs, spawn, stop))
        try:
            await _poison_is_dead_lettered(nc, client, settings, SetLiteral(path="/exit", value=1))
        finally:
            stop.set()
            deaths = await keeper
        # The first daemon's death, then max_attempts more that the record shows died with it in hand.
        assert deaths == 3


async def test_a_killed_daemons_change_set_is_served_again_within_seconds(
    client: RebaserClient, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    # Default ack_wait and progress period (the lease): only the quiet period is long, so the change set is still
    # owned by the daemon that is killed.
    env = {"REBASER_STORAGE": "memory", "REBASER_QUIESCENT_PERIOD": "60"}
    async with daemon_processes() as procs:
        procs.append(await spawn_daemon(nats_url, subject_prefix, tmp_path, env, "a"))
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        assert (
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=10)
        ).ok
        procs.append(await spawn_daemon(nats_url, subject_prefix, tmp_path, env, "b"))
        procs[0].kill()
        await procs[0].wait(10)
        killed = time.monotonic()
        second = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=2)], timeout=30)
        stall = time.monotonic() - killed
        assert second.ok
        print(f"\nserved again {stall:.2f}s after the owner was killed")
        # The default ack_wait (2.5 s) bounds it; an ack_wait of 30 s would fail this.
        assert stall < 10


async def test_a_request_that_freezes_the_daemon_is_dead_lettered(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    # A blocking call longer than ack_wait: the daemon's event loop stops, so it cannot renew its lease; the other
    # daemon takes the change set over and freezes on the same request, and so on, until max_attempts.
    settings = Settings(prefix=subject_prefix)
    async with daemon_processes() as procs:
        for name in ("a", "b"):
            procs.append(await spawn_daemon(nats_url, subject_prefix, tmp_path, ENV, name))
        await _poison_is_dead_lettered(nc, client, settings, SetLiteral(path="/block", value=4))


async def _poison_is_dead_lettered(
    nc: NatsClient, client: RebaserClient, settings: Settings, poison: SetLiteral
) -> None:
    """``poison`` and a good request behind it: the poison ends in an error reply and a dead letter, the good one
    is applied, nothing else is."""
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    bad_call = asyncio.create_task(client.enqueue_updates_with_reply(wk, cs, [poison], timeout=90))
    good_call = asyncio.create_task(
        client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=90)
    )
    bad, ok = await bad_call, await good_call
    assert bad.status.kind == "error" and "died or froze" in bad.status.message
    assert ok.ok
    store = ChangeSetStore(nc.jetstream(), settings)
    await store.open()
    assert await applied(store, wk, cs) == [str(ok.id)]
    dlq = await nc.jetstream().get_last_msg(
        settings.subjects.dead_letter_stream, settings.subjects.dead_letter(wk, cs)
    )
    assert dlq.headers is not None and "died or froze" in dlq.headers[h.DEAD_LETTER_REASON]
