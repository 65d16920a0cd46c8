"""Sharded streams on the 3-node cluster (R3): leaders spread over the servers, nothing lost when a node dies,
the layout changed online. The smoke test runs in CI; the rest are ``slow``."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SpoolConfig
from rebaser_client.admin.streams import change_streams, show_layout
from rebaser_core.embedded import NatsCluster
from rebaser_core.nats.shard_info import spread_leaders
from rebaser_core.subjects import Subjects
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.shard_load import Load


def _settings(prefix: str, **overrides: Any) -> Any:
    # ack_wait leaves room for a leader election (a few seconds) before a live owner's lease counts as lost.
    values: dict[str, Any] = dict(
        replicas=3, storage="file", quiescent_period=0.3, ack_wait=5.0, progress_period=1.0
    )
    values.update(overrides)
    return fast_settings(prefix, **values)


async def _connect(cluster: NatsCluster, n: int) -> list[NatsClient]:
    # Each connection starts at a different node, and may reconnect to any.
    urls = cluster.urls
    return [
        await nats.connect(servers=urls[i % len(urls) :] + urls[: i % len(urls)], max_reconnect_attempts=-1)
        for i in range(n)
    ]


async def _leaders_spread(nc: NatsClient, prefix: str, streams: int) -> list[str]:
    js = nc.jetstream(timeout=5)
    await spread_leaders(nc, js, Subjects(prefix), range(streams))

    async def spread() -> list[str] | None:
        shown = await show_layout(nc, Subjects(prefix))
        leaders = [s["leader"] for s in shown["shards"]]
        return leaders if None not in leaders and len(set(leaders)) == min(streams, 3) else None

    leaders = await wait_for(spread, timeout=30, interval=0.2, message="shard leaders on different servers")
    assert leaders is not None
    return leaders


async def test_cluster_smoke_three_r3_shards(nats_cluster: NatsCluster, subject_prefix: str) -> None:
    app = RecordingApp()
    conns = await _connect(nats_cluster, 3)
    try:
        settings = _settings(subject_prefix, streams=3)
        async with (
            running_daemon(conns[0], settings, app, start_timeout=60) as d0,
            running_daemon(conns[1], settings, app, start_timeout=60),
            RebaserClient(conns[2], prefix=subject_prefix) as client,
        ):
            leaders = await _leaders_spread(conns[2], subject_prefix, 3)
            assert sorted(leaders) == sorted(n.server_name for n in nats_cluster.nodes)
            load = Load(9)
            await load.send(client, 6)
            await load.check(d0.store)
            assert app.overlaps == []
    finally:
        for conn in conns:
            await conn.close()


@pytest.mark.slow
@pytest.mark.parametrize(("streams", "mode"), [(3, "pinned"), (6, "shared"), (6, "pinned")])
async def test_cluster_node_killed_mid_run_loses_nothing(
    nats_cluster: NatsCluster, subject_prefix: str, streams: int, mode: str, tmp_path: Path
) -> None:
    """While a shard's leader is being elected its stream answers nothing; the client spools what it cannot publish
    (durable, replayed in order), so every request a caller was told is stored is applied, in order."""
    app = RecordingApp()
    conns = await _connect(nats_cluster, 4)
    killed: int | None = None
    try:
        base: dict[str, Any] = dict(streams=streams, assignment=mode)
        if mode == "pinned":
            base["daemons"] = 3
        daemons = [
            running_daemon(
                conns[i], _settings(subject_prefix, replica_index=i, **base), app, start_timeout=60
            )
            for i in range(3)
        ]
        async with (
            daemons[0] as d0,
            daemons[1],
            daemons[2],
            RebaserClient(
                conns[3],
                prefix=subject_prefix,
                publish_timeout=20,
                spool=SpoolConfig(tmp_path / "spool.db", flush_timeout=60),
            ) as client,
        ):
            await _leaders_spread(conns[3], subject_prefix, streams)
            load = Load(12)
            sending = asyncio.create_task(load.send(client, 20, pause=0.02))
            await load.started(48)
            killed = 1  # a node some daemons and some shard leaders are on
            nats_cluster.kill_node(killed)
            await sending
            await load.check(d0.store, timeout=120)
            assert app.overlaps == []
    finally:
        if killed is not None:
            await asyncio.to_thread(nats_cluster.start_node, killed)
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.close()


@pytest.mark.slow
async def test_cluster_scale_up_and_down_under_load(
    nats_cluster: NatsCluster, subject_prefix: str, tmp_path: Path
) -> None:
    app = RecordingApp()
    conns = await _connect(nats_cluster, 4)
    try:
        settings = _settings(subject_prefix, streams=3)
        async with (
            running_daemon(conns[0], settings, app, start_timeout=60) as d0,
            running_daemon(conns[1], settings, app, start_timeout=60),
            RebaserClient(
                conns[2],
                prefix=subject_prefix,
                publish_timeout=20,
                spool=SpoolConfig(tmp_path / "spool.db", flush_timeout=60),
            ) as client,
        ):
            for target in (6, 2):
                load = Load(12)
                sending = asyncio.create_task(load.send(client, 20, pause=0.02))
                await load.started(24)
                layout = await change_streams(conns[3], Subjects(subject_prefix), target, timeout=120)
                await sending
                assert layout.streams == target and not layout.migrating
                await load.check(d0.store, timeout=120)
            assert app.overlaps == []
    finally:
        for conn in conns:
            await conn.close()
