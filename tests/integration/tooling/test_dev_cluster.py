"""``rebaser-server dev-cluster`` as a user runs it: it starts, serves a request, keeps serving when the
daemon that owns
a change set is SIGKILLed (and starts that daemon again), and SIGTERM stops every process it started."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, RebaserUnavailable, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.connect import ConnectOptions
from rebaser_core.testing import wait_for
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.cli.main import main
from rebaser_server.devtools.devload import run_load
from rebaser_server.testing import fast_settings, running_daemon

ROOT = Path(__file__).resolve().parents[3]


def read_status(data: Path) -> dict[str, Any] | None:
    try:
        status: dict[str, Any] = json.loads((data / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return status


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def owner_of(status: dict[str, Any], change_set: ChangeSetId) -> dict[str, Any] | None:
    """The daemon whose /status lists the change set as owned."""
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for daemon in status["daemons"]:
            async with http.get(f"{daemon['http_url']}/status") as response:
                owned = (await response.json())["owned"]["change_sets"]
            if any(str(change_set) in name for name in owned):
                return dict(daemon)
    return None


async def spawn_dev_cluster(output: Path, *args: str) -> asyncio.subprocess.Process:
    """``rebaser-server dev-cluster ARGS`` as a user starts it, its output in ``output``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REBASER_NATS_URL", None)
    with output.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            *(sys.executable, "-c", "from rebaser_server.cli.main import main; main()"),
            "dev-cluster",
            *args,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            cwd=str(ROOT),
            start_new_session=True,  # like a shell job: nothing sent to the test runner's group reaches it
        )


async def stop_for_sure(proc: asyncio.subprocess.Process, seen: set[int]) -> None:
    """A test that failed half-way: stop the dev cluster the way a user would, then every PID it reported for sure."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    for pid in filter(alive, seen):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_dev_cluster_serves_survives_a_killed_daemon_and_stops_cleanly(tmp_path: Path) -> None:
    data, output = tmp_path / "dev", tmp_path / "dev-cluster.out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REBASER_NATS_URL", None)
    proc = await spawn_dev_cluster(output, "--daemons", "2", "--data-dir", str(data), "--stop-timeout", "20")
    seen: set[int] = set()  # every PID it reported, to check at the end that none is left
    try:

        def running() -> dict[str, Any] | None:
            assert proc.returncode is None, output.read_text()
            status = read_status(data)
            return status if status and status["state"] == "running" else None

        status = await wait_for(running, timeout=120, interval=0.2, message="the dev cluster did not start")
        seen.update(n["pid"] for n in status["nats"])
        seen.update(d["pid"] for d in status["daemons"])
        text = output.read_text()
        assert status["client_url"] in text and "export REBASER_NATS_URL=" in text
        assert all(str(d["pid"]) in text and d["http_url"] in text for d in status["daemons"])

        # A second dev cluster on the same directory is refused in one line, and leaves the first one's status alone.
        second = await asyncio.create_subprocess_exec(
            *(sys.executable, "-c", "from rebaser_server.cli.main import main; main()"),
            *("dev-cluster", "--daemons", "1", "--data-dir", str(data)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            cwd=str(ROOT),
        )
        refusal = (await asyncio.wait_for(second.communicate(), 60))[0].decode()
        assert second.returncode == 1 and f"data directory {data} is in use" in refusal, refusal
        assert "Traceback" not in refusal and read_status(data) == status

        options = ConnectOptions(servers=(status["client_url"],), name="test-dev-cluster")
        async with await RebaserClient.connect(options) as client:
            wk, cs = WorkspacePk.new(), ChangeSetId.new()
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/n", value=0)], timeout=30
            )
            assert reply.ok

            victim = await wait_for(lambda: owner_of(status, cs), timeout=10, message="no daemon owns it")
            os.kill(victim["pid"], signal.SIGKILL)
            for n in range(1, 4):  # the killed daemon's change set, then fresh ones: all served by the other
                for change_set in (cs, ChangeSetId.new()):
                    reply = await client.enqueue_updates_with_reply(
                        wk, change_set, [SetLiteral(path="/n", value=n)], timeout=30
                    )
                    assert reply.ok, reply
            assert (await client.get_change_set(wk, cs, "/n")).values["/n"] == 3

        def restarted() -> dict[str, Any] | None:
            now = running()
            slot = now and next(d for d in now["daemons"] if d["index"] == victim["index"])
            return now if slot and slot["pid"] not in (None, victim["pid"]) and slot["http_url"] else None

        status = await wait_for(
            restarted, timeout=60, interval=0.2, message="the killed daemon was not restarted"
        )
        seen.update(d["pid"] for d in status["daemons"])
        assert "killed by SIGKILL" in output.read_text()

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0, output.read_text()
        await wait_for(lambda: not any(map(alive, seen)), timeout=10, message=f"left running: {seen}")
        final = read_status(data)
        assert final is not None and final["state"] == "stopped"
        assert "dev cluster stopped" in output.read_text()
    finally:
        await stop_for_sure(proc, seen)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--app", "no_such_module:App"], "cannot load --app no_such_module:App: ModuleNotFoundError"),
        (["--daemons", "0"], "Invalid value for '--daemons'"),
        (["--nats-port", "65535"], "Invalid value for '--nats-port'"),
    ],
)
def test_mistakes_are_one_line_errors_before_anything_starts(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["dev-cluster", *args])
    assert result.exit_code in (1, 2) and message in result.output, result.output
    assert "Traceback" not in result.output


async def test_the_demo_load_reports_replies(nc: NatsClient, nats_url: str, subject_prefix: str) -> None:
    lines: list[str] = []
    async with running_daemon(nc, fast_settings(subject_prefix), SnapshotApp()):
        load = asyncio.create_task(
            run_load([nats_url], lines.append, prefix=subject_prefix, report_every=0.2)
        )
        try:
            await wait_for(
                lambda: any(
                    re.match(r"load: [1-9]\d* replies .* 0 errors, 0 timeouts, latency", s) for s in lines
                ),
                timeout=20,
                message=f"no replies reported: {lines}",
            )
        finally:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load


async def test_the_demo_load_stops_even_if_a_cancellation_is_swallowed(
    nats_url: str, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # nats-py's request (asyncio.wait_for) can swallow a cancellation on Python 3.11: a worker stopped only by its
    # cancellation would go on sending, and the load (and the dev cluster's Ctrl-C) would never end.
    entered = asyncio.Event()

    async def swallowing(*_args: object, **_kwargs: object) -> object:
        if not entered.is_set():
            entered.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(
                    1.0
                )  # a request in flight that swallows its cancellation: the fault itself
        else:
            await asyncio.sleep(
                1.0
            )  # the next requests are as slow: the load must stop without their answers
        raise RebaserUnavailable("no daemon in this test")

    monkeypatch.setattr(RebaserClient, "enqueue_updates_with_reply", swallowing)
    load = asyncio.create_task(
        run_load([nats_url], lambda _line: None, prefix=subject_prefix, change_sets=1, report_every=60)
    )
    await asyncio.wait_for(entered.wait(), 10)
    load.cancel()
    done, _ = await asyncio.wait({load}, timeout=15)
    if not done:
        load.cancel()  # lands in the worker's sleep this time: the test's leftovers end
    assert done, "the load did not stop"


async def test_dev_cluster_with_accounts_serves_a_caller_of_its_own_account(tmp_path: Path) -> None:
    """``--accounts docs/nats-accounts.conf``: every node loads it (keeping fsync and its monitoring endpoint), the
    daemons connect as its daemons' user, and a caller in an account of its own gets its reply; one without
    credentials is refused."""
    data, output = tmp_path / "dev", tmp_path / "dev-cluster.out"
    conf = ROOT / "docs" / "nats-accounts.conf"
    proc = await spawn_dev_cluster(output, "--daemons", "1", "--data-dir", str(data), "--accounts", str(conf))
    seen: set[int] = set()
    try:

        def running() -> dict[str, Any] | None:
            assert proc.returncode is None, output.read_text()
            status = read_status(data)
            return status if status and status["state"] == "running" else None

        status = await wait_for(running, timeout=120, interval=0.2, message="the dev cluster did not start")
        seen.update(n["pid"] for n in status["nats"])
        seen.update(d["pid"] for d in status["daemons"])
        text = output.read_text()
        assert status["accounts"] == str(conf) and "fsync before every acknowledgement" in text
        assert "monitor http://127.0.0.1:" in text
        url = status["client_url"].replace("nats://", "nats://client-1:change-me-client-1@")
        options = ConnectOptions(servers=(url,), inbox_prefix="_INBOX.client-1", name="test-dev-cluster")
        async with await RebaserClient.connect(options) as client:
            reply = await client.enqueue_updates_with_reply(
                WorkspacePk.new(), ChangeSetId.new(), [SetLiteral(path="/n", value=0)], timeout=30
            )
            assert reply.ok, reply
        anonymous = ConnectOptions(
            servers=(status["client_url"],), connect_timeout=2, extra={"max_reconnect_attempts": 0}
        )
        with pytest.raises(RebaserUnavailable):
            await RebaserClient.connect(anonymous)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0, output.read_text()
        await wait_for(lambda: not any(map(alive, seen)), timeout=10, message=f"left running: {seen}")
    finally:
        await stop_for_sure(proc, seen)
