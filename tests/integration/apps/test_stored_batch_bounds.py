"""Stored batches are bounded (docs/protocol.md §14, docs/capacity.md#bounds): in age and in total by the stream, per
workspace and when left unfinished by the daemons' batch sweep, so one workspace cannot fill, or evict, what every
workspace's batches share."""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NatsClient
from nats.js import api as js_api
from nats.js.errors import APIError

from rebaser_client import ChangeSetId, RebaserClient, SetLiteral, WorkspacePk
from rebaser_core.api import StoredUpdates, Update
from rebaser_core.batches import PART_BYTES, encode_batch
from rebaser_core.errors import RebaserBusy
from rebaser_core.nats.streams import ensure_streams, stored_batches_stream_config
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.testing import fast_settings, running_daemon


def _updates(tag: str, parts: int) -> list[Update]:
    """A batch of ``parts`` parts (its last one shorter), unlike any other tag's."""
    updates: list[Update] = [
        SetLiteral(path=f"/{tag}/{i}", value="x" * 1000) for i in range(250 * parts - 20)
    ]
    assert -(-len(encode_batch(updates)[1]) // PART_BYTES) == parts
    return updates


async def _flood_parts(nc: NatsClient, settings: Settings, wk: WorkspacePk, parts: int) -> int:
    """Parts of 256 KiB, each of another batch, never a manifest: what a hostile client writes. How many were
    stored before the stream refused one."""
    js, subjects = nc.jetstream(), settings.subjects
    for n in range(parts):
        try:
            await js.publish(
                subjects.batch_part(wk, f"{n:064x}", 0),
                b"p" * PART_BYTES,
                stream=subjects.stored_batches_stream,
            )
        except APIError as err:
            assert err.err_code == 10077, err  # the stream is full: discard new
            return n
    return parts


async def _messages_of(nc: NatsClient, settings: Settings, wk: WorkspacePk) -> int:
    subjects = settings.subjects
    info = await nc.jetstream().stream_info(
        subjects.stored_batches_stream, subjects_filter=subjects.batch_part(wk, "*", "*")
    )
    return sum((info.state.subjects or {}).values())


async def test_an_existing_stored_batches_stream_gets_the_bounds(nc: NatsClient, subject_prefix: str) -> None:
    """Batches used to be kept for ever (max_age, max_msgs unset): a daemon's start-up gives the stream its bounds."""
    settings = fast_settings(subject_prefix)
    js = nc.jetstream()
    unbounded = stored_batches_stream_config(settings)
    unbounded.max_age, unbounded.max_msgs, unbounded.max_bytes = 0, -1, -1
    await js.add_stream(unbounded)
    await ensure_streams(js, settings, consumer=False)
    config = (await js.stream_info(settings.subjects.stored_batches_stream)).config
    defaults = Settings()
    assert (config.max_age, config.max_msgs) == (
        defaults.stored_batches_max_age,
        defaults.stored_batches_max_msgs,
    )
    assert (config.max_age, config.max_msgs) == (24 * 3600, 8_192)  # a day; 2 GiB of parts at most
    assert config.discard == js_api.DiscardPolicy.NEW and config.max_msgs_per_subject == 1


async def test_a_full_stored_batches_stream_refuses_new_batches_as_busy(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """The stream-wide cap, discard new: nothing stored is dropped to make room, and the client says why."""
    settings = fast_settings(subject_prefix, stored_batches_max_msgs=12)
    async with running_daemon(nc, settings, SnapshotApp(), sweep=False):
        kept = await client.store_batch(WorkspacePk.new(), _updates("kept", 2))
        assert await _flood_parts(nc, settings, WorkspacePk.new(), 100) == 12 - 3
        with pytest.raises(RebaserBusy, match="stored_batches_max_msgs") as refused:
            await client.store_batch(WorkspacePk.new(), _updates("late", 1))
        assert refused.value.limit == "stored_batches" and refused.value.retry_after > 0
        assert kept.address  # still stored: the stream did not drop it for the flood
        info = await nc.jetstream().stream_info(settings.subjects.stored_batches_stream)
        assert info.state.messages == 12


async def test_a_flood_of_parts_without_a_manifest_is_bounded_and_swept(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """Scaled down: 120 parts of 256 KiB and no manifest used to stay for ever (31.5 MB). Now the stream holds at
    most stored_batches_max_msgs, the sweep deletes what one workspace holds over its share and the unfinished
    batches, and another workspace's batches are stored and applied."""
    settings = fast_settings(
        subject_prefix,
        stored_batches_max_msgs=48,
        stored_batches_max_msgs_per_workspace=16,
        stored_batch_unfinished_age=1.0,
        stored_batches_sweep_interval=0.5,
    )
    async with running_daemon(nc, settings, SnapshotApp()) as daemon:
        victim, flooder = WorkspacePk.new(), WorkspacePk.new()
        before = await client.store_batch(victim, _updates("before", 3))  # 4 messages
        stored = await _flood_parts(nc, settings, flooder, 120)
        assert stored < 120  # refused once the stream was full: bounded, whatever the sweep did meanwhile

        async def stored_after() -> StoredUpdates:
            return await client.store_batch(victim, _updates("after", 3))

        after = await wait_for(
            stored_after,
            timeout=30,
            retry_on=(RebaserBusy,),
            message="the victim's batch stored after the flood",
        )
        await wait_for(
            lambda: _zero(nc, settings, flooder), timeout=30, message="the flooder's unfinished parts swept"
        )
        for batch in (before, after):
            cs = ChangeSetId.new()
            assert (await client.enqueue_updates_with_reply(victim, cs, batch, timeout=30)).ok
        assert daemon.stats.stored_batches_deleted >= stored


async def _zero(nc: NatsClient, settings: Settings, wk: WorkspacePk) -> bool:
    return await _messages_of(nc, settings, wk) == 0


async def test_a_workspace_over_its_share_loses_its_own_oldest_batches_only(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """Complete batches too: a workspace holding more than stored_batches_max_msgs_per_workspace messages loses its
    oldest batches, whole, until it is back within its share; nobody else's batch is touched."""
    settings = fast_settings(
        subject_prefix, stored_batches_max_msgs_per_workspace=16, stored_batches_sweep_interval=0.5
    )
    async with running_daemon(nc, settings, SnapshotApp()):
        victim, flooder = WorkspacePk.new(), WorkspacePk.new()
        kept = await client.store_batch(victim, _updates("victim", 3))  # 4 messages, within its share
        theirs = [
            await client.store_batch(flooder, _updates(f"f{n}", 5)) for n in range(5)
        ]  # 6 messages each
        await wait_for(
            lambda: _at_most(nc, settings, flooder, 16),
            timeout=30,
            message="the flooder back within its share",
        )
        assert await _messages_of(nc, settings, flooder) == 12  # its newest two batches
        assert await _messages_of(nc, settings, victim) == 4
        oldest = await client.enqueue_updates_with_reply(flooder, ChangeSetId.new(), theirs[0], timeout=30)
        assert oldest.status.kind == "error" and "does not exist" in oldest.status.message
        assert (
            await client.enqueue_updates_with_reply(flooder, ChangeSetId.new(), theirs[-1], timeout=30)
        ).ok
        assert (await client.enqueue_updates_with_reply(victim, ChangeSetId.new(), kept, timeout=30)).ok


async def _at_most(nc: NatsClient, settings: Settings, wk: WorkspacePk, messages: int) -> bool:
    return await _messages_of(nc, settings, wk) <= messages


async def test_messages_no_daemon_would_read_are_removed_one_by_one(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """A workspace token that is not a canonical ULID (a literal ``*`` among them), an address that is not one, a
    part that is neither a number nor the manifest: never read, so removed; by sequence, so that a ``*`` token does
    not act as a wildcard on the batches of every workspace."""
    settings = fast_settings(subject_prefix, stored_batches_sweep_interval=0.5)
    js, subjects = nc.jetstream(), settings.subjects
    async with running_daemon(nc, settings, SnapshotApp()):
        victim = WorkspacePk.new()
        kept = await client.store_batch(victim, _updates("kept", 2))
        head = subjects.batch_part(victim, kept.address, 0).rsplit(".", 3)[0]  # [P.]rebaser.batches
        junk = [
            f"{head}.*.{kept.address}.0",
            f"{head}.*.{kept.address}.manifest",
            f"{head}.{str(victim).lower()}.{kept.address}.0",
            f"{head}.{victim}.{'z' * 64}.0",
            f"{head}.{victim}.{kept.address}.01",
        ]
        for subject in junk:
            await js.publish(subject, b"junk", stream=subjects.stored_batches_stream)

        async def only_the_batch_left() -> bool:
            info = await js.stream_info(subjects.stored_batches_stream)
            return info.state.messages == 3

        await wait_for(only_the_batch_left, timeout=30, message="the junk removed, the batch kept")
        assert (await client.enqueue_updates_with_reply(victim, ChangeSetId.new(), kept, timeout=30)).ok
