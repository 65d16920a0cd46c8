"""Sharded streams on one server: shared and pinned daemons, refusals, a shard without its daemon."""

from __future__ import annotations

import asyncio
import os
import sys

import nats
import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient
from rebaser_core.errors import LayoutMismatch
from rebaser_core.layout import shard_of
from rebaser_core.testing import wait_for
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.shard_load import Load


async def _connections(url: str, n: int) -> list[NatsClient]:
    return [await nats.connect(url) for _ in range(n)]


async def test_shared_daemons_serve_three_shards_in_order(nats_url: str, subject_prefix: str) -> None:
    settings = fast_settings(subject_prefix, streams=3, quiescent_period=0.05)
    app = RecordingApp()
    conns = await _connections(nats_url, 3)
    try:
        async with (
            running_daemon(conns[0], settings, app) as d0,
            running_daemon(conns[1], settings, app) as d1,
            RebaserClient(conns[2], prefix=subject_prefix) as client,
        ):
            assert d0.shards.shards == d1.shards.shards == [0, 1, 2]
            load = Load(12, every_shard_of=3)
            await load.send(client, 10)
            await load.check(d0.store)
            assert app.overlaps == []
            used = {shard_of(load.workspace, cs, 3) for cs in load.change_sets}
            assert used == {0, 1, 2}  # every shard carried work
            status = await d0.status()
            assert status["layout"]["streams"] == 3
            assert [s["shard"] for s in status["jetstream"]["shards"]] == [0, 1, 2]
    finally:
        for conn in conns:
            await conn.close()


async def test_pinned_daemons_serve_their_own_shards(nats_url: str, subject_prefix: str) -> None:
    base = dict(streams=3, assignment="pinned", daemons=2, quiescent_period=0.05)
    app = RecordingApp()
    conns = await _connections(nats_url, 3)
    try:
        async with (
            running_daemon(conns[0], fast_settings(subject_prefix, replica_index=0, **base), app) as d0,
            running_daemon(conns[1], fast_settings(subject_prefix, replica_index=1, **base), app) as d1,
            RebaserClient(conns[2], prefix=subject_prefix) as client,
        ):
            assert (d0.shards.shards, d1.shards.shards) == ([0, 2], [1])
            load = Load(12, every_shard_of=3)
            await load.send(client, 8)
            await load.check(d0.store)
            assert app.overlaps == []
            # Each daemon took tasks only from its own shards.
            assert d0.stats.tasks_taken > 0 and d1.stats.tasks_taken > 0
    finally:
        for conn in conns:
            await conn.close()


async def test_more_pinned_daemons_than_streams_is_refused(nc: NatsClient, subject_prefix: str) -> None:
    settings = fast_settings(subject_prefix, streams=2, assignment="pinned", daemons=3, replica_index=0)
    daemon = Daemon(nc, settings, RecordingApp())
    with pytest.raises(LayoutMismatch, match="3 daemons but only 2 streams"):
        await daemon.start(timeout=10)
    await daemon.shutdown()


async def test_replica_index_from_hostname_ordinal(nc: NatsClient, subject_prefix: str) -> None:
    from rebaser_server.daemon.shards import served_shards

    settings = fast_settings(subject_prefix, assignment="pinned", daemons=2)
    from rebaser_core.layout import Layout

    layout = Layout(streams=4, mode="pinned")
    assert served_shards(layout, settings, hostname="rebaser-1") == [1, 3]
    with pytest.raises(LayoutMismatch, match="--replica-index"):
        served_shards(layout, settings, hostname="worker")


async def test_flags_that_disagree_with_the_layout_are_refused(nats_url: str, subject_prefix: str) -> None:
    conns = await _connections(nats_url, 2)
    try:
        async with running_daemon(conns[0], fast_settings(subject_prefix, streams=3), RecordingApp()):
            other = Daemon(conns[1], fast_settings(subject_prefix, streams=2), RecordingApp())
            with pytest.raises(LayoutMismatch, match="--streams 2 but the cluster's layout has 3"):
                await other.start(timeout=10)
            await other.shutdown()
            with pytest.raises(LayoutMismatch, match="--streams 4"):
                async with RebaserClient(conns[1], prefix=subject_prefix, streams=4):
                    pass
            # Without the flag, or with the right one, a client follows the layout.
            async with RebaserClient(conns[1], prefix=subject_prefix, streams=3) as client:
                assert client._router.layout.streams == 3
    finally:
        for conn in conns:
            await conn.close()


async def test_pinned_shard_without_its_daemon_waits_and_is_shown(nats_url: str, subject_prefix: str) -> None:
    """Pinned mode, daemon 1 of 2 down: its shard's change sets wait (nothing lost, nothing misapplied), the
    status names the shard without a daemon, and once daemon 1 is up they are applied in order."""
    # The fifo intake: "a shard without a daemon" is told by nobody pulling its shared consumer.
    base = dict(streams=2, assignment="pinned", daemons=2, quiescent_period=0.05, intake="fifo")
    app = RecordingApp()
    conns = await _connections(nats_url, 3)
    try:
        async with (
            running_daemon(conns[0], fast_settings(subject_prefix, replica_index=0, **base), app) as d0,
            RebaserClient(conns[2], prefix=subject_prefix) as client,
        ):
            load = Load(8, every_shard_of=2)
            stranded = [cs for cs in load.change_sets if shard_of(load.workspace, cs, 2) == 1]
            assert stranded, "some change sets hash to shard 1"
            await load.send(client, 3)

            async def shown() -> bool:
                status = await d0.status()
                return 1 in status["jetstream"]["unserved_shards"]

            await wait_for(shown, timeout=10, message="status names shard 1 as unserved")
            async with running_daemon(conns[1], fast_settings(subject_prefix, replica_index=1, **base), app):
                await load.check(d0.store)
            assert app.overlaps == []
    finally:
        for conn in conns:
            await conn.close()


async def test_daemon_cli_refuses_a_disagreeing_streams_flag_in_one_line(
    nc: NatsClient, nats_url: str, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix, streams=3), RecordingApp()):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rebaser_server",
            "--nats-url",
            nats_url,
            "--prefix",
            subject_prefix,
            "--http-port",
            "-1",
            env={**os.environ, "REBASER_STREAMS": "2"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(60):
                _out, err = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 1
    last = err.decode().strip().splitlines()[-1]
    assert last.startswith("Error: LayoutMismatch: this daemon was started with --streams 2"), err.decode()
    assert "Traceback" not in err.decode()


async def test_settled_query_and_admin_views_follow_the_shard(nats_url: str, subject_prefix: str) -> None:
    """The settled query and ``rebaser change-set show`` look in the change set's shard, not only shard 0."""
    from rebaser_client.admin.change_set import change_set_report
    from rebaser_client.admin.status import status_report
    from rebaser_core.ids import ChangeSetId, WorkspacePk
    from rebaser_core.subjects import Subjects

    conns = await _connections(nats_url, 2)
    try:
        async with (
            # The fifo intake: the status sums the shards' shared consumers (pulls waiting on each).
            running_daemon(conns[0], fast_settings(subject_prefix, streams=3, intake="fifo"), RecordingApp()),
            RebaserClient(conns[1], prefix=subject_prefix) as client,
        ):
            wk = WorkspacePk.new()
            cs = next(c for c in iter(ChangeSetId.new, None) if shard_of(wk, c, 3) != 0)
            await client.enqueue_updates(wk, cs, [])
            answer = await client.wait_settled(wk, cs, timeout=20)
            assert answer.settled and not answer.queued
            report = await change_set_report(conns[1], Subjects(subject_prefix), wk, cs)
            assert report is not None and report.record is not None and report.queued_total == 0
            status = await status_report(conns[1], Subjects(subject_prefix))
            assert len(status.streams) == 2 * 3 + 1  # requests and tasks of 3 shards, dead letters
            assert status.tasks_consumer is not None and status.tasks_consumer["waiting_pulls"] >= 3
    finally:
        for conn in conns:
            await conn.close()


async def test_switching_to_shared_serves_a_shard_whose_pinned_daemon_is_down(
    nats_url: str, subject_prefix: str
) -> None:
    """The operator's remedy for a pinned shard without its daemon: ``rebaser streams set N --assignment shared``;
    the running daemon follows the layout within a second and serves every shard."""
    from rebaser_client.admin.streams import change_streams
    from rebaser_core.subjects import Subjects

    # The fifo intake: "a shard without a daemon" is told by nobody pulling its shared consumer.
    base = dict(streams=2, assignment="pinned", daemons=2, quiescent_period=0.05, intake="fifo")
    conns = await _connections(nats_url, 3)
    try:
        async with (
            running_daemon(
                conns[0], fast_settings(subject_prefix, replica_index=0, **base), RecordingApp()
            ) as d0,
            RebaserClient(conns[1], prefix=subject_prefix) as client,
        ):
            assert d0.shards.shards == [0]
            load = Load(8)
            await load.send(client, 3)
            layout = await change_streams(conns[2], Subjects(subject_prefix), 2, mode="shared")
            assert layout.mode == "shared"
            await wait_for(
                lambda: d0.shards.shards == [0, 1], timeout=10, message="daemon 0 serves shard 1 too"
            )
            await load.check(d0.store)
    finally:
        for conn in conns:
            await conn.close()
