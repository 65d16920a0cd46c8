"""Changing the number of shards online, under load: nothing lost, each change set's order kept, both ways."""

from __future__ import annotations

import asyncio

import nats
import pytest
from click.testing import CliRunner
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient
from rebaser_client.admin.cli.main import main as cli
from rebaser_client.admin.streams import change_streams, show_layout
from rebaser_core.errors import LayoutMismatch
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.layout import shard_of
from rebaser_core.subjects import Subjects
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.shard_load import Load


async def _reshard_under_load(nats_url: str, prefix: str, before: int, after: int, **flags: object) -> None:
    settings = fast_settings(prefix, streams=before, quiescent_period=0.2, **flags)
    app = RecordingApp()
    conns = [await nats.connect(nats_url) for _ in range(4)]
    try:
        async with (
            running_daemon(conns[0], settings, app) as d0,
            running_daemon(conns[1], settings, app) as d1,
            RebaserClient(conns[2], prefix=prefix) as client,
        ):
            load = Load(16)
            # Requests keep coming while the layout changes: some change sets have requests in their old shard
            # when the new one starts receiving theirs.
            sending = asyncio.create_task(load.send(client, 25, pause=0.01))
            await load.started(32)
            lines: list[str] = []
            layout = await change_streams(
                conns[3], Subjects(prefix), after, timeout=60, progress=lines.append
            )
            await sending
            assert layout.streams == after and not layout.migrating
            await load.check(d0.store)
            assert app.overlaps == []
            assert d0.layout.streams == after or d1.layout.streams == after
            shown = await show_layout(conns[3], Subjects(prefix))
            assert [s["shard"] for s in shown["shards"]] == list(range(after))
            if after < before:
                assert any("deleted the streams of removed shard" in line for line in lines)
    finally:
        for conn in conns:
            await conn.close()


async def test_scale_up_three_to_six_under_load(nats_url: str, subject_prefix: str) -> None:
    await _reshard_under_load(nats_url, subject_prefix, 3, 6)


async def test_scale_down_six_to_two_under_load(nats_url: str, subject_prefix: str) -> None:
    await _reshard_under_load(nats_url, subject_prefix, 6, 2)


async def test_unsafe_changes_are_refused(nc: NatsClient, subject_prefix: str) -> None:
    with pytest.raises(LayoutMismatch, match="no shard layout yet"):
        await change_streams(nc, Subjects(subject_prefix), 3)
    settings = fast_settings(subject_prefix, streams=2, assignment="pinned", daemons=2, replica_index=0)
    async with running_daemon(nc, settings, RecordingApp()):
        with pytest.raises(LayoutMismatch, match="--daemons"):
            await change_streams(nc, Subjects(subject_prefix), 3)
        with pytest.raises(LayoutMismatch, match="leave a daemon idle"):
            await change_streams(nc, Subjects(subject_prefix), 1, daemons=2)


async def test_streams_show_cli(nats_url: str, nc: NatsClient, subject_prefix: str) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix, streams=3), RecordingApp()):
        result = await asyncio.to_thread(
            CliRunner().invoke, cli, ["streams", "show", "--nats-url", nats_url, "--prefix", subject_prefix]
        )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("layout: 3 streams, shared")
    assert len([line for line in result.output.splitlines() if line[:1].isdigit()]) == 3


async def test_old_shard_drains_before_new_shard(nats_url: str, subject_prefix: str) -> None:
    """Deterministic: requests queued in their old shards while no daemon runs, the layout changed, newer requests
    sent to the new shards; once daemons run, every change set's old requests are applied before its new ones."""
    settings = fast_settings(subject_prefix, streams=2, quiescent_period=0.2)
    app = RecordingApp()
    conns = [await nats.connect(nats_url) for _ in range(3)]
    try:
        async with running_daemon(conns[0], settings, app):
            pass  # writes the layout (2 streams) and creates the streams
        load = Load(16)
        async with RebaserClient(conns[1], prefix=subject_prefix) as client:
            await load.send(client, 5)  # queued in the 2 old shards, nobody serving
            with pytest.raises(TimeoutError, match="still have work"):
                await change_streams(conns[2], Subjects(subject_prefix), 5, timeout=0.5)

            async def follows() -> bool:
                await client._router._follow_once()
                return client._router.layout.streams == 5

            assert await follows()
            await load.send(client, 5)  # routed by the new layout: most change sets moved shard
        assert any(
            shard_of(load.workspace, cs, 2) != shard_of(load.workspace, cs, 5) for cs in load.change_sets
        )
        async with (
            running_daemon(conns[0], settings.model_copy(update={"streams": None}), app) as d0,
            running_daemon(conns[1], settings.model_copy(update={"streams": None}), app) as d1,
        ):
            await load.check(d0.store)
            assert app.overlaps == []
            assert (
                d0.stats.tasks_deferred + d1.stats.tasks_deferred > 0
            )  # new-shard tasks waited for old ones
            layout = await change_streams(conns[2], Subjects(subject_prefix), 5, timeout=30)
            assert not layout.migrating
    finally:
        for conn in conns:
            await conn.close()


async def test_a_daemon_a_layout_change_behind_does_not_take_a_new_shard_task_for_the_drain(
    nats_url: str, subject_prefix: str
) -> None:
    """4 -> 2: a change set moves from shard 3 into shard 1, which exists already. A daemon that has not read the new
    layout yet (it polls once a second) must not take a task from shard 1 for its old shard's drain and go first,
    applying the new request before the one still queued in shard 3."""
    from rebaser_core.ids import ChangeSetId, WorkspacePk
    from rebaser_server.app import ChangeSet
    from rebaser_server.changeset.migration import old_shard_busy

    conns = [await nats.connect(nats_url) for _ in range(3)]
    try:
        async with running_daemon(
            conns[0], fast_settings(subject_prefix, streams=4), RecordingApp()
        ) as daemon:
            pass  # the layout (4 streams); the daemon's copy of it stays at 4 from now on
        wk = WorkspacePk.new()
        cs = next(c for c in iter(ChangeSetId.new, None) if shard_of(wk, c, 4) == 3)
        async with RebaserClient(conns[1], prefix=subject_prefix) as client:
            await client.enqueue_updates(wk, cs, [])  # queued in shard 3, nobody serving
        with pytest.raises(TimeoutError, match="still have work"):
            await change_streams(conns[2], Subjects(subject_prefix), 2, timeout=0.5)
        assert daemon.layout.streams == 4 and not daemon.layout.migrating  # a layout change behind
        new_shard = Subjects(subject_prefix).for_shard(shard_of(wk, cs, 2))
        assert new_shard.shard == 1
        busy = await old_shard_busy(daemon.nats, daemon.settings, daemon.layout, ChangeSet(wk, cs), new_shard)
        assert busy == "requests still queued in its old shard 3"
    finally:
        for conn in conns:
            await conn.close()


async def test_purge_while_the_layout_changes_removes_the_old_shards_requests_too(
    nats_url: str, subject_prefix: str
) -> None:
    """``rebaser change-set purge`` looks in the change set's old shard too: what is queued there would otherwise
    stay, and be applied (first) once a daemon serves it."""
    from rebaser_client.admin.repairs import purge_change_set
    from rebaser_core.ids import ChangeSetId, WorkspacePk

    conns = [await nats.connect(nats_url) for _ in range(3)]
    try:
        async with running_daemon(conns[0], fast_settings(subject_prefix, streams=4), RecordingApp()):
            pass  # the layout (4 streams) and the streams; nobody serves them from now on
        wk = WorkspacePk.new()
        cs = next(c for c in iter(ChangeSetId.new, None) if shard_of(wk, c, 4) == 3)
        async with RebaserClient(conns[1], prefix=subject_prefix) as client:
            await client.enqueue_updates(wk, cs, [])
            await client.enqueue_updates(wk, cs, [])  # both queued in shard 3
            with pytest.raises(TimeoutError, match="still have work"):
                await change_streams(conns[2], Subjects(subject_prefix), 2, timeout=0.5)
            await client._router._follow_once()
            await client.enqueue_updates(wk, cs, [])  # queued in its new shard, 1
        result = await purge_change_set(conns[2], Subjects(subject_prefix), wk, cs)
        assert result.removed == 3 and result.task == "waiting"
        for shard in (3, 1):
            names = Subjects(subject_prefix).for_shard(shard)
            info = (
                await conns[2]
                .jetstream()
                .stream_info(names.requests_stream, subjects_filter=names.requests(wk, cs))
            )
            assert not info.state.subjects, f"shard {shard} still holds requests of the change set"
    finally:
        for conn in conns:
            await conn.close()


async def test_a_removed_shard_is_retired_before_it_is_checked_and_deleted(
    nats_url: str, nc: NatsClient, subject_prefix: str
) -> None:
    """Checking a removed shard empty and then deleting it would lose a request a stale client got acknowledged
    in between: its streams stop listening first. A request that landed before that is drained, not stranded."""
    from rebaser_client.admin.streams import _retire_removed  # the step under test

    settings = fast_settings(subject_prefix, streams=2)
    async with running_daemon(nc, settings, RecordingApp()):
        js = nc.jetstream()
        subjects = Subjects(subject_prefix)
        removed = subjects.for_shard(1)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        subject = removed.requests(wk, cs)
        original = (await js.stream_info(removed.requests_stream)).config.subjects
        # Not empty: a stale client's request is in the removed shard (a daemon would drain it; here it is held
        # by not publishing its task). Retiring is undone, and the layout must not settle yet.
        await js.publish(subject, b"stale", stream=removed.requests_stream)
        lines: list[str] = []
        assert not await _retire_removed(js, subjects, 1, range(2), lines.append)
        assert (await js.stream_info(removed.requests_stream)).config.subjects == original
        assert any("got work while retiring" in line for line in lines)
        # Empty: retired, and a publish there is no longer acknowledged by anyone.
        await js.purge_stream(removed.requests_stream)
        assert await _retire_removed(js, subjects, 1, range(2), lines.append)
        with pytest.raises(nats.errors.NoRespondersError):
            await nc.request(subject, b"late", timeout=2)
