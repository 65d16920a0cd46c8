"""Changing a deployment's intake online (``rebaser streams intake``), under load, as a reshard is tested: change
sets owned and requests queued when it starts, nothing lost, each change set's order kept, nobody applying twice at
once, both ways, over two shards."""

from __future__ import annotations

import asyncio

import nats
import pytest
from click.testing import CliRunner
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_client.admin.cli.main import main as cli
from rebaser_client.admin.intake import change_intake
from rebaser_client.admin.streams import show_layout
from rebaser_core.errors import LayoutMismatch
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.layout import Intake, Layout
from rebaser_core.nats.listing import stream_subjects
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.subjects import TASKS_CONSUMER, Subjects
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.shard_load import Load


async def _tasks_consumers(nc: NatsClient, prefix: str, shards: int) -> set[str]:
    names = set()
    for shard in range(shards):
        stream = Subjects(prefix).for_shard(shard).tasks_stream
        names |= {info.name or "" for info in await nc.jetstream().consumers_info(stream)}
    return names


async def _change_under_load(nats_url: str, prefix: str, before: Intake, after: Intake) -> None:
    # A quiet period longer than the test: every change set the load touched is owned when the change starts, and is
    # handed back by it.
    settings = fast_settings(prefix, streams=2, quiescent_period=300, intake=before)
    app = RecordingApp()
    conns = [await nats.connect(nats_url) for _ in range(4)]
    try:
        async with (
            running_daemon(conns[0], settings, app) as d0,
            running_daemon(conns[1], settings, app) as d1,
            RebaserClient(conns[2], prefix=prefix) as client,
        ):
            # Requests keep coming while the intake changes (some queue while no daemon takes a task), then each
            # change set gets more once it is done: served through the new intake.
            load = Load(12, every_shard_of=2)
            sending = asyncio.create_task(load.send(client, 40, pause=0.1))
            await load.started(48)
            assert len(d0.owned) + len(d1.owned) > 0
            lines: list[str] = []
            layout = await change_intake(conns[3], Subjects(prefix), after, progress=lines.append)
            assert layout.intake == after and not layout.switching_intake
            await sending
            await wait_for(
                lambda: d0.layout == layout and d1.layout == layout, timeout=10, message="the daemons follow"
            )
            await load.send(client, 5)
            await load.check(d0.store)
            assert app.overlaps == []
            assert any("hand back" in line for line in lines) and lines[-1] == f"intake: {after}"
            assert d0.stats.tasks_interrupted + d1.stats.tasks_interrupted > 0  # owned ones were handed back
            consumers = await _tasks_consumers(conns[3], prefix, 2)
            if after == "fair":
                assert TASKS_CONSUMER not in consumers
                assert f"{TASKS_CONSUMER}-{load.workspace}" in consumers
            elif after == "lanes":
                assert consumers == {
                    Subjects.lane_consumer(lane) for lane in range(fast_settings(None).lanes)
                }
            else:
                assert consumers == {TASKS_CONSUMER}
            # Every task left is stored the new intake's way (by lane, or not).
            for shard in range(2):
                names = Subjects(prefix).for_shard(shard)
                stored = await stream_subjects(conns[3].jetstream(), names.tasks_stream, names.tasks_all)
                assert all(names.is_lane_task(subject) == (after == "lanes") for subject in stored), stored
            shown = await show_layout(conns[3], Subjects(prefix))
            assert shown["intake"] == after and shown["intake_from"] is None
    finally:
        for conn in conns:
            await conn.close()


# make test changes a deployment into the lanes from each of the layouts that exist (the upgrade path), and out of
# them into fifo; the other three changes (into fair, and from fair into fifo) run in make chaos (slow): each is
# about 6 s of CPU.
OTHER_WAYS = pytest.mark.slow


@OTHER_WAYS
async def test_fifo_to_fair_under_load(nats_url: str, subject_prefix: str) -> None:
    await _change_under_load(nats_url, subject_prefix, "fifo", "fair")


async def test_fifo_to_lanes_under_load(nats_url: str, subject_prefix: str) -> None:
    await _change_under_load(nats_url, subject_prefix, "fifo", "lanes")


async def test_fair_to_lanes_under_load(nats_url: str, subject_prefix: str) -> None:
    await _change_under_load(nats_url, subject_prefix, "fair", "lanes")


@OTHER_WAYS
async def test_lanes_to_fair_under_load(nats_url: str, subject_prefix: str) -> None:
    await _change_under_load(nats_url, subject_prefix, "lanes", "fair")


async def test_lanes_to_fifo_under_load(nats_url: str, subject_prefix: str) -> None:
    await _change_under_load(nats_url, subject_prefix, "lanes", "fifo")


@OTHER_WAYS
async def test_fair_to_fifo_under_load(nats_url: str, subject_prefix: str) -> None:
    await _change_under_load(nats_url, subject_prefix, "fair", "fifo")


async def test_a_change_of_intake_during_a_reshard_is_refused_and_a_repeat_does_nothing(
    nc: NatsClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()):
        lines: list[str] = []
        layout = await change_intake(nc, Subjects(subject_prefix), "lanes", progress=lines.append)
        assert layout.intake == "lanes" and lines == ["the intake is already lanes; nothing to do"]
    kv = await nc.jetstream().key_value(Subjects(subject_prefix).layout_bucket)
    entry = await kv.get(Subjects(subject_prefix).layout_key)
    migrating = Layout.decode(entry.value or b"").changed_to(2)
    await kv.update(Subjects(subject_prefix).layout_key, migrating.encode(), last=entry.revision)
    with pytest.raises(LayoutMismatch, match="still draining"):
        await change_intake(nc, Subjects(subject_prefix), "fifo")


async def test_streams_intake_cli(nats_url: str, nc: NatsClient, subject_prefix: str) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon:
        result = await asyncio.to_thread(
            CliRunner().invoke,
            cli,
            ["streams", "intake", "fair", "--nats-url", nats_url, "--prefix", subject_prefix],
        )
        assert result.exit_code == 0, result.output
        assert result.output.splitlines()[-1] == "layout: 1 streams, shared, fair intake"
        shown = await asyncio.to_thread(
            CliRunner().invoke, cli, ["streams", "show", "--nats-url", nats_url, "--prefix", subject_prefix]
        )
        assert "fair intake" in shown.output.splitlines()[0]
        await wait_for(lambda: daemon.layout.intake == "fair", timeout=10, message="the daemon follows")


async def test_tasks_queued_with_no_daemon_are_moved_into_their_lanes_and_back(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # No daemon runs: every queued change set's task waits, stored the fair intake's way. The change to lanes stores
    # each again in its lane (and back), and a daemon of the new intake then applies every request.
    settings = fast_settings(subject_prefix, intake="fair")
    names = Subjects(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()):
        pass  # the layout (fair) and the streams exist
    queued = [(WorkspacePk.new(), ChangeSetId.new()) for _ in range(12)]
    for wk, cs in queued:
        await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=1)])

    async def stored() -> dict[str, int]:
        return await stream_subjects(nc.jetstream(), names.tasks_stream, names.tasks_all)

    for intake, lanes in (("lanes", True), ("fair", False), ("lanes", True)):
        lines: list[str] = []
        await change_intake(nc, names, intake, progress=lines.append)
        assert f"moved {len(queued)} tasks to the {intake} intake's subjects" in lines, lines
        subjects = await stored()
        assert len(subjects) == len(queued)
        assert all(names.is_lane_task(subject) == lanes for subject in subjects), subjects
    app = RecordingApp()
    async with running_daemon(nc, fast_settings(subject_prefix, intake="lanes"), app) as daemon:
        await wait_for(
            lambda: daemon.stats.requests_applied == len(queued), timeout=30, message="all applied"
        )


async def test_a_stream_made_before_its_layout_said_lanes_has_its_tasks_stored_in_their_lanes(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # The streams made by a script (no transform, the shared consumer) and requests queued before any daemon ran:
    # the first daemon writes a lanes layout, removes the idle shared consumer, and stores the queued tasks in their
    # lanes, where the lanes' consumers find them.
    settings = fast_settings(subject_prefix, intake="lanes")
    await ensure_streams(nc.jetstream(), settings)
    queued = [(WorkspacePk.new(), ChangeSetId.new()) for _ in range(6)]
    for wk, cs in queued:
        await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=1)])
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        await wait_for(
            lambda: daemon.stats.requests_applied == len(queued), timeout=30, message="all applied"
        )
        consumers = {c.name for c in await nc.jetstream().consumers_info(settings.subjects.tasks_stream)}
        assert TASKS_CONSUMER not in consumers
