"""Daemons in subprocesses, for tests that kill or signal them. Stopped by PID at the end, whatever happens."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class DaemonProcess:
    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    async def wait(self, timeout: float) -> int:
        return await asyncio.wait_for(self.proc.wait(), timeout)


async def spawn_daemon(
    nats_url: str | list[str] | None,
    prefix: str,
    workdir: Path,
    env: dict[str, str],
    name: str,
    *,
    args: tuple[str, ...] = (),
    new_session: bool = False,
) -> DaemonProcess:
    """A daemon on ``nats_url``; with None, on its embedded server (pass ``--data-dir`` etc. in ``args``).

    ``new_session``: in a process group of its own, like a shell job, so a test can signal the whole group as a
    terminal's Ctrl-C does (without also hitting the test runner)."""
    log = workdir / f"{name}.log"
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    # An inherited REBASER_NATS_URL would turn an embedded-server daemon into a client of some other server.
    full_env.pop("REBASER_NATS_URL", None)
    # As fast_settings: a test's deployment makes 4 lane consumers, not 32 (unless the test says otherwise).
    full_env.setdefault("REBASER_LANES", "4")
    urls = [] if nats_url is None else [nats_url] if isinstance(nats_url, str) else nats_url
    out = log.open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rebaser_server",
        *(arg for url in urls for arg in ("--nats-url", url)),
        *args,
        "--http-port",
        "0",
        "--prefix",
        prefix,
        "--app",
        "tests.support.apps:RecordingApp",
        "--log-level",
        # DEBUG (every task taken, released and handed back) to explain a rare stall of a long chaos run.
        os.environ.get("REBASER_CHAOS_LOG_LEVEL", "INFO"),
        stdout=out,
        stderr=asyncio.subprocess.STDOUT,
        env=full_env,
        cwd=str(ROOT),
        start_new_session=new_session,
    )
    out.close()
    daemon = DaemonProcess(proc, log)
    # A bound on a failure, not a timing: a loaded machine (coverage, many workers) takes far longer than usual.
    deadline = asyncio.get_running_loop().time() + 60
    try:
        while b"rebaser daemon serving" not in log.read_bytes():
            if proc.returncode is not None or asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"daemon {name} did not start:\n{log.read_text()}")
            await asyncio.sleep(0.05)
    except BaseException:
        # Failed or cancelled while starting: the caller never learns the process, so stop it here.
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    return daemon


async def run_daemon(
    args: tuple[str, ...], workdir: Path, name: str, timeout: float, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run ``rebaser-server args`` until it exits by itself; its exit code and output. Killed at the deadline."""
    log = workdir / f"{name}.log"
    extra, env = env or {}, {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REBASER_NATS_URL", None)
    env.update(extra)
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rebaser_server",
            *args,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            cwd=str(ROOT),
        )
    try:
        code = await asyncio.wait_for(proc.wait(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return code, log.read_text()


@asynccontextmanager
async def daemon_processes() -> AsyncIterator[list[DaemonProcess]]:
    started: list[DaemonProcess] = []
    try:
        yield started
    finally:
        for d in started:
            if d.proc.returncode is None:
                d.kill()
                await d.proc.wait()


def read_record(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
