"""A NATS outage under load: the client refuses work fast and with bounded memory, the daemon survives in place,
nothing acknowledged is lost, nothing is applied twice, and work flows again without restarting anything.

Each test runs its own nats-server (file store in tmp_path), since it stops and restarts it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from rebaser_client import RebaserClient, RebaserUnavailable, SetLiteral
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.connect import ConnectOptions, connect
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp, applied

ROOT = Path(__file__).resolve().parents[3]
PUBLISH_TIMEOUT = 1.0
PENDING_SIZE = 64 * 1024
MAX_IN_FLIGHT = 64


def options(server: NatsServer, name: str) -> ConnectOptions:
    return ConnectOptions(servers=(server.url,), name=name, pending_size=PENDING_SIZE)


@pytest.mark.parametrize(
    "outage",
    [
        pytest.param(0.0, id="blip"),
        # Longer than the daemon's JetStream timeout (5 s) and ack_wait (3 s): commits in hand time out (and land
        # late, from nats-py's reconnect buffer), progress acks stop, and tasks are redelivered after the restart.
        pytest.param(6.0, id="long"),
    ],
)
async def test_outage_fails_fast_bounded_and_recovers_without_restarts(
    own_server: NatsServer, subject_prefix: str, outage: float
) -> None:
    settings = fast_settings(subject_prefix, storage="file", ready_max_disconnected=0.5)
    daemon_nc = await connect(options(own_server, "daemon"))
    client = await RebaserClient.connect(
        options(own_server, "client"),
        prefix=subject_prefix,
        publish_timeout=PUBLISH_TIMEOUT,
        max_in_flight=MAX_IN_FLIGHT,
    )
    try:
        async with running_daemon(daemon_nc, settings, RecordingApp()) as daemon:
            wk = WorkspacePk.new()
            change_sets = [ChangeSetId.new() for _ in range(4)]
            sent: dict[ChangeSetId, list[str]] = {cs: [] for cs in change_sets}
            # A slow first request per change set, so some are applied, some in hand and some queued at the cut.
            for i in range(5):
                for cs in change_sets:
                    updates = [SetLiteral(path="/sleep", value=0.2 if i == 0 else 0)]
                    sent[cs].append(str(await client.enqueue_updates(wk, cs, updates)))

            await asyncio.to_thread(own_server.stop, keep_files=True)
            outage_started = time.monotonic()
            await wait_for(
                lambda: client.status().connection != "connected", timeout=5, message="outage seen"
            )

            # -- during the outage: every enqueue fails fast, nothing piles up --------------------------------
            latencies: list[float] = []
            peak_in_flight = peak_pending = 0
            tracemalloc.start()
            try:
                for i in range(2000):
                    started = time.monotonic()
                    with pytest.raises(RebaserUnavailable):
                        await client.enqueue_updates(wk, change_sets[i % 4], [SetLiteral(path="/n", value=i)])
                    latencies.append(time.monotonic() - started)
                    status = client.status()
                    peak_in_flight = max(peak_in_flight, status.in_flight)
                    peak_pending = max(peak_pending, status.pending_bytes)
                _, peak_bytes = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert max(latencies) < PUBLISH_TIMEOUT + 1.0
            assert peak_bytes < 2 * 1024 * 1024, f"tracemalloc peak {peak_bytes} bytes during the burst"
            assert peak_in_flight <= MAX_IN_FLIGHT and peak_pending <= PENDING_SIZE
            print(  # measured numbers, for the record (pytest -s)
                f"\noutage burst: 2000 refusals, max latency {max(latencies) * 1000:.2f} ms, "
                f"tracemalloc peak {peak_bytes / 1024:.0f} KiB, nats-py pending {peak_pending} B"
            )
            assert client.status().connection == "reconnecting"

            # The daemon reports the outage: not ready once it lasts longer than ready_max_disconnected.
            async def daemon_not_ready() -> bool:
                status = await daemon.status()
                return not status["ready"] and any("unreachable" in r for r in status["not_ready"])

            await wait_for(daemon_not_ready, timeout=5, message="daemon not ready during the outage")
            status = await daemon.status()
            assert status["jetstream"]["stale"] and status["nats"]["state"] == "reconnecting"

            # The outage's length is what this case is about, so here a fixed wait is the point.
            await asyncio.sleep(max(0.0, outage - (time.monotonic() - outage_started)))

            # -- back: same port, same store -------------------------------------------------------------
            await asyncio.to_thread(own_server.start)
            store = daemon.store

            async def all_applied() -> bool:
                for cs in change_sets:
                    if await applied(store, wk, cs) != sent[cs]:
                        return False
                return True

            # Exactly the acknowledged requests, in order, once each; none of the 2,000 refused ones got in.
            await wait_for(
                all_applied, timeout=30, message="every acknowledged request applied", retry_on=(Exception,)
            )
            after = await client.enqueue_updates_with_reply(
                wk, change_sets[0], [SetLiteral(path="/a", value=1)]
            )
            assert after.ok
            fresh = await client.enqueue_updates_with_reply(
                wk, ChangeSetId.new(), [SetLiteral(path="/a", value=1)]
            )
            assert fresh.ok
            assert await applied(store, wk, change_sets[0]) == [*sent[change_sets[0]], str(after.id)]
            # The daemon sees the reconnect by polling the connection: wait for it rather than race it.
            await wait_for(lambda: daemon.stats.nats_reconnects >= 1, timeout=5, message="reconnect seen")

            async def ready_again() -> bool:
                return bool((await daemon.status())["ready"])

            await wait_for(ready_again, timeout=10, message="daemon ready again")
            assert client.status().last_publish_at is not None
    finally:
        await client.close()
        await daemon_nc.close()


async def test_owned_change_set_resumes_at_once_after_a_server_restart(
    own_server: NatsServer, subject_prefix: str
) -> None:
    # A long quiet period: the change set stays owned across the restart, with an ordered consumer the restarted
    # server no longer has. nats-py alone would notice only after two missed heartbeats (~10-20 s).
    settings = fast_settings(subject_prefix, storage="file", quiescent_period=60)
    daemon_nc = await connect(options(own_server, "daemon"))
    client = await RebaserClient.connect(options(own_server, "client"), prefix=subject_prefix)
    try:
        async with running_daemon(daemon_nc, settings, RecordingApp()) as daemon:
            wk, cs = WorkspacePk.new(), ChangeSetId.new()
            first = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/a", value=1)], timeout=10
            )
            assert first.ok and len(daemon.owned) == 1

            await asyncio.to_thread(own_server.restart)
            await wait_for(
                lambda: client.status().connection == "connected", timeout=10, message="reconnected"
            )
            started = time.monotonic()
            second = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/a", value=2)], timeout=10
            )
            assert second.ok
            assert time.monotonic() - started < 5.0
            assert await applied(daemon.store, wk, cs) == [str(first.id), str(second.id)]
            # Handed back after the reconnect, or (on a slow machine) its lease ran out during the restart.
            assert daemon.stats.reconnect_handbacks + daemon.stats.tasks_lease_lost >= 1
    finally:
        await client.close()
        await daemon_nc.close()


async def test_sigterm_during_an_outage_exits_cleanly(
    own_server: NatsServer, subject_prefix: str, tmp_path: Path
) -> None:
    log = tmp_path / "daemon.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "REBASER_ACK_WAIT": "3",
        "REBASER_PROGRESS_PERIOD": "0.5",
        "REBASER_QUIESCENT_PERIOD": "30",  # still owning its change set when the outage starts
    }
    args = ["-m", "rebaser_server", "--nats-url", own_server.url, "--prefix", subject_prefix]
    args += ["--app", "tests.support.apps:RecordingApp", "--http-port", "-1"]
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *args,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            cwd=str(ROOT),
        )
    try:
        await wait_for(lambda: b"rebaser daemon serving" in log.read_bytes(), timeout=20, message="daemon up")
        # The client is closed during the outage too (leaving this block), which must not raise either.
        async with await RebaserClient.connect(
            options(own_server, "client"), prefix=subject_prefix
        ) as client:
            response = await client.enqueue_updates_with_reply(
                WorkspacePk.new(), ChangeSetId.new(), [SetLiteral(path="/a", value=1)], timeout=10
            )
            assert response.ok
            await asyncio.to_thread(own_server.stop, keep_files=True)
            await wait_for(
                lambda: b"NATS connection lost" in log.read_bytes(), timeout=5, message="outage seen"
            )
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 15) == 0, log.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
