"""SIGUSR1 makes a running daemon log where each of its coroutines waits, and changes nothing else."""

from __future__ import annotations

import signal
from pathlib import Path

from rebaser_core.testing import wait_for
from tests.support.daemons import daemon_processes, spawn_daemon


async def test_sigusr1_logs_every_coroutine_and_the_daemon_serves_on(
    nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    async with daemon_processes() as procs:
        daemon = await spawn_daemon(nats_url, subject_prefix, tmp_path, {"REBASER_STORAGE": "memory"}, "d")
        procs.append(daemon)
        daemon.proc.send_signal(signal.SIGUSR1)
        await wait_for(lambda: b"SIGUSR1:" in daemon.log.read_bytes(), timeout=20, message="tasks dumped")
        # One "---- <task name>" line and a stack per coroutine: the daemon's own and nats-py's.
        assert daemon.log.read_bytes().count(b"\n---- ") >= 3
        assert daemon.proc.returncode is None
        daemon.terminate()
        assert await daemon.wait(30) == 0
