"""``rebaser-server`` on its embedded nats-server, in subprocesses: restart, signals, crashes, and its guards."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rebaser_client import RebaserClient
from rebaser_core.ids import ChangeSetId, WorkspacePk
from tests.integration.daemons import DaemonProcess, daemon_processes, spawn_daemon

_EMBEDDED_LINE = re.compile(rb"embedded nats-server listening on (nats://\S+) \(pid (\d+)")

# The owner keeps its change set for a minute; a hand-back lost on the way out would be noticed only after
# ack_wait (30 s). A reply within _HANDED_BACK proves the hand-back reached the server.
HOLD_ENV = {
    "REBASER_ACK_WAIT": "30",
    "REBASER_PROGRESS_PERIOD": "5",
    "REBASER_QUIESCENT_PERIOD": "60",
}
_HANDED_BACK = 10.0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


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
    nats_url: str | None, prefix: str, tmp_path: Path, name: str, server_pids: list[int], *args: str
) -> tuple[DaemonProcess, str]:
    """A daemon on ``nats_url``, or (None) on an embedded server with its store in ``tmp_path/data``."""
    if nats_url is not None:
        return await spawn_daemon(nats_url, prefix, tmp_path, HOLD_ENV, name, args=args), nats_url
    embedded_args = ("--data-dir", str(tmp_path / "data"), "--port", "0", *args)
    daemon = await spawn_daemon(None, prefix, tmp_path, HOLD_ENV, name, args=embedded_args)
    url, pid = embedded_server(daemon)
    server_pids.append(pid)
    return daemon, url


async def _request_seconds(url: str, prefix: str, wk: WorkspacePk, cs: ChangeSetId, timeout: float) -> float:
    async with await RebaserClient.connect(url, prefix=prefix) as client:
        started = time.monotonic()
        reply = await client.enqueue_updates_with_reply(wk, cs, [], timeout=timeout)
        assert reply.ok, reply
        return time.monotonic() - started


@pytest.mark.parametrize("embedded", [True, False], ids=["embedded", "external"])
async def test_restart_finds_the_change_set_handed_back(
    embedded: bool, nats_url: str, subject_prefix: str, tmp_path: Path, server_pids: list[int]
) -> None:
    external = None if embedded else nats_url
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    async with daemon_processes() as daemons:
        first, url = await _spawn(external, subject_prefix, tmp_path, "first", server_pids)
        daemons.append(first)
        await _request_seconds(url, subject_prefix, wk, cs, timeout=_HANDED_BACK)
        first.terminate()  # it owns the change set (quiescent period 60 s): SIGTERM must hand it back
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
