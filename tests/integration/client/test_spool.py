"""The client's durable spool: refused or undeliverable requests are kept locally, replayed in order with their
original ids once NATS takes work again (also by the next client after a restart), and applied exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import (
    RebaserBusy,
    RebaserClient,
    SetLiteral,
    SpoolConfig,
    SpoolError,
)
from rebaser_client._spool import Spool
from rebaser_core.api import ENQUEUE_UPDATES_REQUEST, EnqueueUpdatesRequest, InlineUpdates
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.layout import shard_of
from rebaser_core.nats.connect import ConnectOptions, connect
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp, applied


def one(n: int = 0) -> list[SetLiteral]:
    return [SetLiteral(path="/n", value=n)]


async def test_busy_change_set_spools_in_order_then_full_spool_refuses(
    nc: NatsClient, subject_prefix: str, tmp_path: Path
) -> None:
    settings = fast_settings(subject_prefix, requests_max_msgs_per_change_set=1)
    await ensure_streams(nc.jetstream(), settings)
    spool = SpoolConfig(tmp_path / "spool.db", max_requests=3)
    async with RebaserClient(nc, prefix=subject_prefix, spool=spool) as client:
        wk, cs, other = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
        sent = [str(await client.enqueue_updates(wk, cs, one(i))) for i in range(4)]  # 1 queued, 3 spooled
        assert client.status().spool_size == 3
        with pytest.raises(RebaserBusy) as refused:
            await client.enqueue_updates(wk, cs, one(4))
        assert refused.value.limit == "spool"
        # Another change set is not held up by the spooled ones: it goes straight to the stream.
        other_id = str(await client.enqueue_updates(wk, other, one()))
        assert client.status().spool_size == 3

        async with running_daemon(nc, settings, RecordingApp()) as daemon:
            await wait_for(lambda: client.status().spool_size == 0, timeout=15, message="spool drained")

            async def done() -> bool:
                return await applied(daemon.store, wk, cs) == sent

            await wait_for(done, timeout=15, message="spooled requests applied in order")
            assert await applied(daemon.store, wk, other) == [other_id]


async def test_spool_survives_a_client_restart_and_applies_nothing_twice(
    own_server: NatsServer, subject_prefix: str, tmp_path: Path
) -> None:
    settings = fast_settings(subject_prefix, storage="file")
    opts = ConnectOptions(servers=(own_server.url,), name="client")
    spool = SpoolConfig(tmp_path / "spool.db", flush_timeout=1.0)
    setup = await connect(opts)
    await ensure_streams(setup.jetstream(), settings)
    await setup.close()

    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    first = await RebaserClient.connect(opts, prefix=subject_prefix, spool=spool, publish_timeout=1.0)
    sent = [str(await first.enqueue_updates(wk, cs, one(0)))]  # straight into the stream
    await asyncio.to_thread(own_server.stop, keep_files=True)
    await wait_for(lambda: first.status().connection != "connected", timeout=5, message="outage seen")
    sent += [str(await first.enqueue_updates(wk, cs, one(i))) for i in range(1, 6)]  # spooled: ids returned
    assert first.status().spool_size == 5
    await first.close()  # NATS is down: close does not wait; the spool stays on disk

    await asyncio.to_thread(own_server.start)
    daemon_nc = await connect(ConnectOptions(servers=(own_server.url,), name="daemon"))
    try:
        async with (
            running_daemon(daemon_nc, settings, RecordingApp()) as daemon,
            await RebaserClient.connect(opts, prefix=subject_prefix, spool=spool) as second,
        ):
            await wait_for(lambda: second.status().spool_size == 0, timeout=15, message="spool replayed")
            after = await second.enqueue_updates_with_reply(wk, cs, one(6), timeout=10)
            assert after.ok
            assert await applied(daemon.store, wk, cs) == [*sent, str(after.id)]
    finally:
        await daemon_nc.close()


async def test_replay_of_a_request_that_did_land_is_dropped_by_the_stream(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, tmp_path: Path
) -> None:
    # The ambiguous case: a publish that timed out may still have been stored. Its replay carries the same
    # Nats-Msg-Id, so the stream's duplicate window drops it.
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        request = EnqueueUpdatesRequest(
            id=RequestId.new(), workspace_id=wk, change_set_id=cs, updates=InlineUpdates(updates=one())
        )
        assert await client.send(request, timeout=10) is not None
        headers, body = ENQUEUE_UPDATES_REQUEST.encode(request)
        headers["Nats-Expected-Stream"] = settings.subjects.requests_stream
        spool = Spool(SpoolConfig(tmp_path / "spool.db"))
        await spool.open()
        await spool.add(str(request.id), settings.subjects.requests(wk, cs), headers, body)
        await spool.close()

        async with RebaserClient(
            nc, prefix=subject_prefix, spool=SpoolConfig(tmp_path / "spool.db")
        ) as replayer:
            await wait_for(lambda: replayer.status().spool_size == 0, timeout=10, message="replayed")
            later = await replayer.enqueue_updates_with_reply(wk, cs, one(1), timeout=10)
        assert await applied(daemon.store, wk, cs) == [str(request.id), str(later.id)]
        assert daemon.stats.requests_replayed == 0  # dropped by the stream, never even redelivered


async def test_a_client_that_never_read_the_layout_spools_and_replays_to_the_change_sets_shard(
    own_server: NatsServer, subject_prefix: str, tmp_path: Path
) -> None:
    # A client started while NATS is down has not read the layout. Routing by one stream (shard 0), and replaying its
    # spool there as soon as NATS comes back, before its first read of the layout, would send the change set's later
    # requests to its real shard: two shards, no order between them.
    settings = fast_settings(subject_prefix, storage="file", streams=3)
    opts = ConnectOptions(servers=(own_server.url,), name="client")
    daemon_nc = await connect(ConnectOptions(servers=(own_server.url,), name="daemon"))
    async with running_daemon(daemon_nc, settings, RecordingApp()):
        pass  # sets the deployment up: the layout says 3 streams
    await daemon_nc.close()
    wk = WorkspacePk.new()
    cs = next(c for c in iter(ChangeSetId.new, None) if shard_of(wk, c, 3) != 0)
    client_nc = await connect(opts)
    client = RebaserClient(client_nc, prefix=subject_prefix, spool=SpoolConfig(tmp_path / "spool.db"))
    try:
        await asyncio.to_thread(own_server.stop, keep_files=True)
        await wait_for(lambda: not client_nc.is_connected, timeout=5, message="outage seen")
        sent = [str(await client.enqueue_updates(wk, cs, one(i))) for i in range(3)]  # layout never read
        assert client.status().spool_size == 3
        await asyncio.to_thread(own_server.start)
        daemon_nc = await connect(ConnectOptions(servers=(own_server.url,), name="daemon"))
        async with running_daemon(daemon_nc, settings, RecordingApp()) as daemon:
            await wait_for(lambda: client.status().spool_size == 0, timeout=15, message="spool replayed")
            after = await client.enqueue_updates_with_reply(wk, cs, one(3), timeout=10)
            assert after.ok
            assert await applied(daemon.store, wk, cs) == [*sent, str(after.id)]
            record = await daemon.store.read(ChangeSet(wk, cs))
            assert record is not None and record.shard == shard_of(wk, cs, 3)  # nothing went to shard 0
        await daemon_nc.close()
    finally:
        await client.close()
        await client_nc.close()


async def test_one_spool_file_one_client(nc: NatsClient, subject_prefix: str, tmp_path: Path) -> None:
    spool = SpoolConfig(tmp_path / "spool.db")
    async with RebaserClient(nc, prefix=subject_prefix, spool=spool):
        with pytest.raises(SpoolError, match="in use"):
            async with RebaserClient(nc, prefix=subject_prefix, spool=spool):
                pass
    async with RebaserClient(nc, prefix=subject_prefix, spool=spool) as again:  # released on close
        assert again.status().spool_size == 0


def test_settings_unchanged_by_spooling() -> None:
    # The spool is the client's own: nothing about it reaches the wire contract or the daemon's settings.
    assert not any("spool" in name for name in Settings.model_fields)
