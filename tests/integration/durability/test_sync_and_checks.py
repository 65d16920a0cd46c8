"""What an acknowledgement survives, checked against real servers: the embedded server runs with the sync it is
given, and a daemon reads what a server promises (sync setting, replicas) at start-up and after every reconnect,
shows it on /status and /metrics, warns when a power loss would lose acknowledged requests, and refuses to serve
below ``require_durability``."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_core.embedded import NatsCluster, NatsServer
from rebaser_core.errors import DurabilityTooLow
from rebaser_core.nats.connect import ConnectOptions, close_connection, connect
from rebaser_core.nats.layout_store import open_layout, read_durability
from rebaser_core.nats.monitoring import read_server_sync
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.ops.daemon_metrics import DaemonCollector
from rebaser_server.testing import fast_settings
from tests.support.apps import RecordingApp

WARNING = "do not survive a power loss"


@pytest.mark.parametrize(
    ("sync", "always", "interval"), [("always", True, 120.0), ("5s", False, 5.0), (None, False, 120.0)]
)
def test_the_embedded_server_runs_with_the_sync_it_is_given(
    sync: str | None, always: bool, interval: float
) -> None:
    with NatsServer(sync=sync) as server:
        assert server.monitoring_url is not None
        read, problem = read_server_sync(server.monitoring_url)
        assert problem is None and read is not None
        assert (read.always, read.interval) == (always, interval)
        # A restart keeps the monitoring URL, as it keeps the client URL.
        url = server.monitoring_url
        server.restart()
        assert server.monitoring_url == url
        again, _ = read_server_sync(url)
        assert again is not None and (again.always, again.interval) == (always, interval)


def test_a_monitoring_url_that_does_not_answer_is_a_problem_not_a_crash() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    read, problem = read_server_sync(closed)
    assert read is None and problem is not None and closed in problem
    with NatsServer(jetstream=False) as server:
        assert server.monitoring_url is not None
        read, problem = read_server_sync(server.monitoring_url)
        assert read is None and problem is not None and "no JetStream" in problem


@asynccontextmanager
async def started(nc: NatsClient, settings: Settings) -> AsyncIterator[Daemon]:
    """A daemon started (or failing to start) and always shut down."""
    daemon = Daemon(nc, settings, RecordingApp())
    try:
        async with asyncio.timeout(30):
            await daemon.start(timeout=20)
        yield daemon
    finally:
        async with asyncio.timeout(30):
            await daemon.shutdown()


def gauge(daemon: Daemon) -> dict[str, float]:
    for metric in DaemonCollector(daemon).collect():
        if metric.name == "rebaser_durability":
            return {s.labels["level"]: s.value for s in metric.samples}
    return {}


@pytest.mark.parametrize(
    ("sync", "monitored", "level"),
    [
        ("always", True, "power-loss"),
        (None, True, "process-crash"),
        ("1s", True, "process-crash"),
        ("always", False, "unknown"),  # not checked, so not trusted
    ],
)
async def test_the_daemon_shows_what_the_server_promises(
    sync: str | None,
    monitored: bool,
    level: str,
    subject_prefix: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with NatsServer(store_dir=tmp_path / "nats", sync=sync) as server:
        assert server.monitoring_url is not None
        urls = (server.monitoring_url,) if monitored else ()
        settings = fast_settings(subject_prefix, storage="file", nats_monitoring_urls=urls)
        nc = await connect(ConnectOptions(servers=(server.url,), name="daemon"))
        try:
            with caplog.at_level(logging.INFO, logger="rebaser_server.ops.durability"):
                async with started(nc, settings) as daemon:
                    status = await daemon.status()
                    assert status["durability"]["level"] == level
                    assert status["durability"]["min_replicas"] == 1
                    assert f"{subject_prefix}_REBASER_REQUESTS" in status["durability"]["replicas"]
                    assert gauge(daemon) == {
                        name: float(name == level)
                        for name in ("process-crash", "unknown", "node-loss", "power-loss")
                    }
                    # Noted beside the layout, for `rebaser status` run without the monitoring URLs.
                    kv = await open_layout(nc.jetstream(), settings.subjects)
                    assert kv is not None
                    noted = await read_durability(kv)
                    assert noted is not None
                    found, by, at = noted
                    assert (found.level, found.sync, by) == (
                        level,
                        status["durability"]["sync"],
                        daemon.owner,
                    )
                    assert found.as_dict() == status["durability"] and at
        finally:
            await close_connection(nc)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if level == "power-loss":
        assert warnings == []
    else:
        # One clear line, naming the fix.
        assert len(warnings) == 1, warnings
        assert "sync_interval: always" in warnings[0]
        assert (WARNING in warnings[0]) == (level == "process-crash")
        assert ("--nats-monitoring-url" in warnings[0]) == (level == "unknown")


async def test_replicated_streams_survive_a_node_loss_even_with_lazy_sync(
    nats_cluster: NatsCluster, subject_prefix: str
) -> None:
    urls = tuple(n.monitoring_url for n in nats_cluster.nodes if n.monitoring_url)
    assert len(urls) == 3
    settings = fast_settings(subject_prefix, storage="file", replicas=3, nats_monitoring_urls=urls)
    nc = await connect(ConnectOptions(servers=tuple(nats_cluster.urls), name="daemon"))
    try:
        async with started(nc, settings) as daemon:
            durability = daemon.durability
            assert durability is not None
            assert (durability.level, durability.min_replicas, len(durability.servers)) == ("node-loss", 3, 3)
    finally:
        await close_connection(nc)


async def test_below_require_durability_the_daemon_refuses_to_start(
    subject_prefix: str, tmp_path: Path
) -> None:
    with NatsServer(store_dir=tmp_path / "nats") as server:
        assert server.monitoring_url is not None
        settings = fast_settings(
            subject_prefix,
            storage="file",
            nats_monitoring_urls=(server.monitoring_url,),
            require_durability="power-loss",
        )
        nc = await connect(ConnectOptions(servers=(server.url,), name="daemon"))
        try:
            with pytest.raises(DurabilityTooLow, match=r"process-crash.*below require_durability power-loss"):
                async with started(nc, settings):
                    pass
        finally:
            await close_connection(nc)


async def test_durability_is_checked_again_after_a_reconnect(
    subject_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that comes back lazier (a restart with another configuration, a failover) is noticed: the daemon
    that asked for power-loss durability stops, with the reason."""
    store = tmp_path / "nats"
    careful = NatsServer(store_dir=store, sync="always")
    careful.start()
    lazy: NatsServer | None = None
    try:
        assert careful.monitoring_url is not None
        settings = fast_settings(
            subject_prefix,
            storage="file",
            nats_monitoring_urls=(careful.monitoring_url,),
            require_durability="power-loss",
        )
        nc = await connect(ConnectOptions(servers=(careful.url,), name="daemon"))
        try:
            async with started(nc, settings) as daemon:
                assert daemon.durability is not None and daemon.durability.level == "power-loss"
                await asyncio.to_thread(careful.stop)
                # The same client and monitoring ports and store, the default sync.
                lazy = NatsServer(
                    store_dir=store,
                    port=careful.port,
                    monitoring_port=int(careful.monitoring_url.rsplit(":", 1)[1]),
                )
                await asyncio.to_thread(lazy.start)
                await wait_for(lambda: daemon.stopped.is_set(), timeout=20, message="daemon stopped")
                assert daemon.failure is not None and "below require_durability power-loss" in daemon.failure
                assert daemon.durability is not None and daemon.durability.level == "process-crash"
        finally:
            await close_connection(nc)
    finally:
        careful.stop()
        if lazy is not None:
            lazy.stop()
    assert any(
        "survive only process-crash" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR
    )
