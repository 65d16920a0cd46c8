"""Stored update batches (docs/protocol.md §14): kept under their workspace, read only from the request's workspace,
every hostile one refused before it is loaded, and the first layout's object store still read after an upgrade."""

from __future__ import annotations

import hashlib

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import BucketNotFoundError

from rebaser_client import ChangeSetId, RebaserClient, SetLiteral, WorkspacePk
from rebaser_core.api import Update
from rebaser_core.batches import MANIFEST, PART_BYTES, Manifest, encode_batch, split_parts
from rebaser_core.settings import Settings
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.testing import fast_settings, running_daemon


def _batch(n: int) -> bytes:
    return b'{"kind":"inline","updates":[' + b",".join([b'{"op":"remove","path":"/a"}'] * n) + b"]}"


async def _write(
    nc: NatsClient,
    settings: Settings,
    wk: WorkspacePk,
    address: str,
    parts: list[bytes],
    manifest: bytes | None,
) -> None:
    """Parts and manifest written straight to the stream, as a client that skips store_batch's checks would."""
    js, subjects = nc.jetstream(), settings.subjects
    for n, part in enumerate(parts):
        await js.publish(subjects.batch_part(wk, address, n), part, stream=subjects.stored_batches_stream)
    if manifest is not None:
        await js.publish(
            subjects.batch_part(wk, address, MANIFEST), manifest, stream=subjects.stored_batches_stream
        )


async def _refused(client: RebaserClient, wk: WorkspacePk, cs: ChangeSetId, address: str) -> str:
    response = await client.enqueue_updates_with_reply(wk, cs, address, timeout=30)
    assert response.status.kind == "error", response.status
    return response.status.message


async def test_hostile_stored_batches_are_refused_before_they_are_loaded(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, max_stored_batch_bytes=1024 * 1024, max_updates_per_request=1000)
    async with running_daemon(nc, settings, SnapshotApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        # A manifest declaring 50 MB, and no parts: refused on the manifest, before any part is asked for.
        huge = "a" * 64
        await _write(
            nc, settings, wk, huge, [], Manifest(size=50_000_000, parts=-(-50_000_000 // PART_BYTES)).encode()
        )
        assert "max_stored_batch_bytes" in await _refused(client, wk, cs, huge)
        # Whole, but over the limits.
        for data, setting in ((_batch(50_000), "max_stored_batch_bytes"), (_batch(1001), "1001 updates")):
            address = hashlib.sha256(data).hexdigest()
            parts = split_parts(data)
            await _write(nc, settings, wk, address, parts, Manifest(len(data), len(parts)).encode())
            assert setting in await _refused(client, wk, cs, address)
        # Lies: a manifest that is not one, one that does not match its size, a part missing, a size that does not add
        # up, and no manifest yet (a batch still being written).
        data = _batch(12_000)  # two parts
        address = hashlib.sha256(data).hexdigest()
        parts = split_parts(data)
        assert len(parts) == 2
        lies = {
            "manifest": (parts, b'{"size": "x"}'),
            "its parts of": (parts, b'{"size": 10, "parts": 2}'),
            "missing parts [1]": (parts[:1], Manifest(len(data), 2).encode()),
            "its manifest says": (parts, Manifest(len(data) + 1, 2).encode()),
        }
        for n, (expected, (written, manifest)) in enumerate(lies.items()):
            lying = WorkspacePk.new()
            await _write(nc, settings, lying, address, written, manifest)
            assert expected in await _refused(client, lying, ChangeSetId.new(), address), (n, expected)
        unwritten = WorkspacePk.new()
        await _write(nc, settings, unwritten, address, parts, None)
        assert "does not exist" in await _refused(client, unwritten, ChangeSetId.new(), address)
        # Not an address at all: never looked up (a wildcard in the subject would reach other batches).
        for junk in ("*", ">", "a.b", "sha256:" + "A" * 64):
            assert "does not exist" in await _refused(client, wk, cs, junk)
        # The change set goes on.
        assert (await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/ok", value=1)])).ok
        assert daemon.stats.requests_dead_lettered == 3 + len(lies) + 1 + 4


async def test_a_batch_is_found_in_its_workspace_only(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), SnapshotApp()):
        mine, theirs = WorkspacePk.new(), WorkspacePk.new()
        updates: list[Update] = [SetLiteral(path=f"/big/{i}", value="x" * 200) for i in range(3000)]
        stored = await client.store_batch(mine, updates)
        assert "does not exist" in await _refused(client, theirs, ChangeSetId.new(), stored.address)
        cs = ChangeSetId.new()
        assert (await client.enqueue_updates_with_reply(mine, cs, stored, timeout=30)).ok
        assert (await client.get_change_set(mine, cs, "/big/2999")).values == {"/big/2999": "x" * 200}
        # Stored again: the same parts replace themselves, nothing piles up.
        await client.store_batch(mine, updates)
        subjects = fast_settings(subject_prefix).subjects
        info = await nc.jetstream().stream_info(subjects.stored_batches_stream)
        parts = split_parts(encode_batch(updates)[1])
        assert len(parts) > 1 and info.state.messages == len(parts) + 1


async def test_batches_of_the_first_layout_are_still_read_after_an_upgrade(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """A deployment that stored batches in the object store ``REBASER_BATCHES`` (named by address alone) keeps them
    usable: the daemon reads a batch there when the request's workspace has none. A new deployment has no such
    store, and the daemon does not create one."""
    settings = fast_settings(subject_prefix, max_stored_batch_bytes=1024 * 1024, max_updates_per_request=1000)
    js = nc.jetstream()
    async with running_daemon(nc, settings, SnapshotApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        assert "does not exist" in await _refused(client, wk, cs, "b" * 64)
        with pytest.raises(BucketNotFoundError):
            await js.object_store(settings.subjects.batches_bucket)
        # What the previous daemons created, and the previous client wrote.
        store = await js.create_object_store(settings.subjects.batches_bucket)
        data = b'{"kind":"inline","updates":[{"op":"set","path":"/old","value":1}]}'
        address = hashlib.sha256(data).hexdigest()
        await store.put(address, data)
        assert (await client.enqueue_updates_with_reply(wk, cs, address, timeout=30)).ok
        assert (await client.get_change_set(wk, cs, "/old")).values == {"/old": 1}
        # Its limits hold as before.
        for data, setting in ((_batch(50_000), "max_stored_batch_bytes"), (_batch(1001), "1001 updates")):
            address = hashlib.sha256(data).hexdigest()
            await store.put(address, data)
            assert setting in await _refused(client, wk, cs, address)
        assert (await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/ok", value=1)])).ok
