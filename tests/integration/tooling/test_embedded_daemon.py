"""``rebaser-server`` on its embedded nats-server, in subprocesses: restart, signals, crashes, and its guards."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rebaser_client import RebaserClient
from rebaser_core.embedded import find_nats_server
from rebaser_core.embedded.process import PDEATHSIG_SUPPORTED
from rebaser_core.embedded.store import PID_FILE, pid_alive
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from tests.support.daemons import DaemonProcess, daemon_processes, run_daemon, spawn_daemon

_EMBEDDED_LINE = re.compile(rb"embedded nats-server listening on (nats://\S+) \(pid (\d+)")

# The owner keeps its change set for a minute; a hand-back lost on the way out would be noticed only after
# ack_wait (30 s). A reply within _HANDED_BACK proves the hand-back reached the server.
HOLD_ENV = {
    "REBASER_ACK_WAIT": "30",
    "REBASER_PROGRESS_PERIOD": "5",
    "REBASER_QUIESCENT_PERIOD": "60",
}
_HANDED_BACK = 10.0


def embedded_server(daemon: DaemonProcess) -> tuple[str, int]:
    """The URL and PID of a daemon's embedded nats-server, from the line it prints at start-up."""
    found = _EMBEDDED_LINE.search(daemon.log.read_bytes())
    assert found is not None, f"no embedded server line in:\n{daemon.log.read_text()}"
    return found[1].decode(), int(found[2])


@pytest.fixture
async def server_pids() -> AsyncIterator[list[int]]:
    """Embedded nats-servers a test learnt about; any still running at the end is killed by PID."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


async def _spawn(
    nats_url: str | None,
    prefix: str,
    tmp_path: Path,
    name: str,
    server_pids: list[int],
    *args: str,
    new_session: bool = False,
) -> tuple[DaemonProcess, str]:
    """A daemon on ``nats_url``, or (None) on an embedded server with its store in ``tmp_path/data``."""
    if nats_url is not None:
        daemon = await spawn_daemon(
            nats_url, prefix, tmp_path, HOLD_ENV, name, args=args, new_session=new_session
        )
        return daemon, nats_url
    embedded_args = ("--data-dir", str(tmp_path / "data"), "--port", "0", *args)
    daemon = await spawn_daemon(
        None, prefix, tmp_path, HOLD_ENV, name, args=embedded_args, new_session=new_session
    )
    url, pid = embedded_server(daemon)
    server_pids.append(pid)
    return daemon, url


async def _request_seconds(url: str, prefix: str, wk: WorkspacePk, cs: ChangeSetId, timeout: float) -> float:
    async with await RebaserClient.connect(url, prefix=prefix) as client:
        started = time.monotonic()
        reply = await client.enqueue_updates_with_reply(wk, cs, [], timeout=timeout)
        assert reply.ok, reply
        return time.monotonic() - started


def _one_line_error(output: str) -> str:
    """The error a refused start printed: exactly one line, no traceback."""
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, output
    return errors[0]


# ----------------------------------------------------------------------------------------- restart hands back


@pytest.mark.parametrize(
    ("embedded", "stop"),
    [(True, "sigterm"), (True, "ctrl-c"), (False, "sigterm")],
    ids=["embedded-sigterm", "embedded-ctrl-c", "external-sigterm"],
)
async def test_restart_finds_the_change_set_handed_back(
    embedded: bool, stop: str, nats_url: str, subject_prefix: str, tmp_path: Path, server_pids: list[int]
) -> None:
    external = None if embedded else nats_url
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    async with daemon_processes() as daemons:
        first, url = await _spawn(external, subject_prefix, tmp_path, "first", server_pids, new_session=True)
        daemons.append(first)
        await _request_seconds(url, subject_prefix, wk, cs, timeout=_HANDED_BACK)
        # It owns the change set (quiescent period 60 s): stopping must hand it back.
        if stop == "ctrl-c":
            # A terminal's Ctrl-C signals the whole foreground process group; the server must not stop with it.
            assert os.getpgid(server_pids[-1]) != os.getpgid(first.pid)
            os.killpg(first.pid, signal.SIGINT)
        else:
            first.terminate()
        assert await first.wait(20) == 0
        if embedded:
            assert not pid_alive(server_pids[-1]), "the daemon stops its embedded server"

        second, url = await _spawn(external, subject_prefix, tmp_path, "second", server_pids)
        daemons.append(second)
        # Without the hand-back the reply would come only once ack_wait (30 s) has passed.
        seconds = await _request_seconds(url, subject_prefix, wk, cs, timeout=_HANDED_BACK)
        assert seconds < _HANDED_BACK
        second.terminate()
        assert await second.wait(20) == 0


# ------------------------------------------------------------------------ the embedded server's lifecycle


async def test_a_second_daemon_on_one_data_dir_is_refused(
    subject_prefix: str, tmp_path: Path, server_pids: list[int]
) -> None:
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    async with daemon_processes() as daemons:
        first, url = await _spawn(None, subject_prefix, tmp_path, "first", server_pids)
        daemons.append(first)
        args = (
            "--data-dir",
            str(tmp_path / "data"),
            "--port",
            "0",
            "--http-port",
            "0",
            "--prefix",
            subject_prefix,
        )
        code, output = await run_daemon(args, tmp_path, "second", timeout=30)
        assert code != 0
        error = _one_line_error(output)
        assert "in use by another rebaser-server" in error and f"pid {first.pid}" in error, error
        assert "embedded nats-server listening" not in output, "no second server on the store"
        # The first one is untouched: it still serves, on its server.
        assert pid_alive(server_pids[-1])
        assert await _request_seconds(url, subject_prefix, wk, cs, timeout=_HANDED_BACK) < _HANDED_BACK


@pytest.mark.skipif(not PDEATHSIG_SUPPORTED, reason="the parent-death signal is Linux only")
async def test_sigkill_of_the_daemon_takes_its_server_along(
    subject_prefix: str, tmp_path: Path, server_pids: list[int]
) -> None:
    async with daemon_processes() as daemons:
        daemon, _url = await _spawn(None, subject_prefix, tmp_path, "victim", server_pids)
        daemons.append(daemon)
        server = server_pids[-1]
        daemon.kill()
        await daemon.wait(10)
        await wait_for(
            lambda: not pid_alive(server), timeout=10, message="the embedded server outlived its daemon"
        )

        # The data directory is free again for the next daemon.
        again, url = await _spawn(None, subject_prefix, tmp_path, "again", server_pids)
        daemons.append(again)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        assert await _request_seconds(url, subject_prefix, wk, cs, timeout=_HANDED_BACK) < _HANDED_BACK


async def test_a_server_left_on_the_store_is_stopped_first(
    subject_prefix: str, tmp_path: Path, server_pids: list[int]
) -> None:
    # What a daemon killed where the parent-death signal is unavailable leaves behind: its server, still running
    # on the store, named in the store's PID file.
    store = tmp_path / "data" / "nats"
    store.mkdir(parents=True)
    stale = await asyncio.create_subprocess_exec(
        str(find_nats_server()),
        *("-a", "127.0.0.1", "-p", "-1", "-js", "-sd", str(store)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    server_pids.append(stale.pid)
    try:
        (store / PID_FILE).write_text(f"{stale.pid}\n")
        async with daemon_processes() as daemons:
            daemon, url = await _spawn(None, subject_prefix, tmp_path, "next", server_pids)
            daemons.append(daemon)
            assert not pid_alive(stale.pid), "the stale server was stopped before the new one started"
            assert b"left running" in daemon.log.read_bytes()
            wk, cs = WorkspacePk.new(), ChangeSetId.new()
            assert await _request_seconds(url, subject_prefix, wk, cs, timeout=_HANDED_BACK) < _HANDED_BACK
    finally:
        if stale.returncode is None:
            stale.kill()
        await stale.wait()


async def test_a_taken_embedded_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ("--data-dir", str(tmp_path / "data"), "--port", str(port), "--http-port", "-1")
        code, output = await run_daemon(args, tmp_path, "daemon", timeout=30)
    assert code != 0
    error = _one_line_error(output)
    assert f"port {port}" in error and "--port" in error, error


async def test_a_taken_health_port_is_a_clear_error(
    nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ("--nats-url", nats_url, "--prefix", subject_prefix, "--http-port", str(port))
        code, output = await run_daemon(args, tmp_path, "daemon", timeout=30)
    assert code != 0
    error = _one_line_error(output)
    assert f":{port}" in error and "--http-port" in error, error
    assert "rebaser daemon serving" not in output, "it took no work"


async def test_the_client_cli_honours_rebaser_nats_url(
    nats_url: str, subject_prefix: str, tmp_path: Path, server_pids: list[int]
) -> None:
    async with daemon_processes() as daemons:
        daemon, url = await _spawn(None, subject_prefix, tmp_path, "daemon", server_pids)
        daemons.append(daemon)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        env = {**os.environ, "REBASER_NATS_URL": url, "REBASER_PREFIX": subject_prefix}
        cli = [sys.executable, "-c", "from rebaser_client.admin.cli.main import main; main()"]
        proc = await asyncio.create_subprocess_exec(
            *cli,
            "request",
            "--workspace",
            str(wk),
            "--change-set",
            str(cs),
            "--set",
            "/a=1",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, output.decode()


# ----------------------------------------------------------------------------------- durability


async def test_the_embedded_server_fsyncs_before_acknowledging_by_default(
    subject_prefix: str, tmp_path: Path, server_pids: list[int]
) -> None:
    async with daemon_processes() as daemons:
        daemon, _url = await _spawn(None, subject_prefix, tmp_path, "daemon", server_pids)
        daemons.append(daemon)
        output = daemon.log.read_text()
        assert "fsync before every acknowledgement" in output, output
        health = re.search(r"health endpoint on (http://\S+)", output)
        assert health is not None, output

        def durability() -> dict[str, object]:
            with urllib.request.urlopen(f"{health[1]}/status", timeout=5) as response:
                return dict(json.load(response)["durability"])

        # Read back from the server through its monitoring endpoint, not taken from the flag.
        found = await asyncio.to_thread(durability)
        assert (found["level"], found["sync"]) == ("power-loss", "always"), found
        assert "power loss" not in output, "no warning"
        daemon.terminate()
        assert await daemon.wait(20) == 0


async def test_a_lazy_embedded_server_warns_and_can_be_refused(tmp_path: Path) -> None:
    base = ("--data-dir", str(tmp_path / "data"), "--port", "0", "--http-port", "-1", "--sync", "1s")
    code, output = await run_daemon((*base, "--require-durability", "power-loss"), tmp_path, "refused", 60)
    assert code == 1, output
    error = _one_line_error(output)
    assert error.startswith("Error: DurabilityTooLow:"), error
    assert "survive only process-crash" in error, error
    # The warning line comes first, once.
    assert output.count("do not survive a power loss or kernel crash") == 1, output
    assert "rebaser daemon serving" not in output, "it took no work"


async def test_sync_is_refused_for_an_external_server(nats_url: str, tmp_path: Path) -> None:
    code, output = await run_daemon(("--nats-url", nats_url, "--sync", "1s"), tmp_path, "daemon", 30)
    assert code == 2, output
    assert "--nats-monitoring-url" in output and "sync_interval: always" in output, output
