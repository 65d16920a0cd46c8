"""Snapshot objects written once, in the Object Store's own format: nats-py reads them back, a second write of the
same name writes nothing and leaves no chunks behind."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import ObjectStoreConfig, StorageType

from rebaser_core.nats.requester import Requester
from rebaser_server.apps.snapshots.objects import (
    CHUNK_SIZE,
    MultipleChunks,
    ObjectCorrupt,
    ObjectReader,
    ObjectWriter,
)


async def _chunk_messages(nc: NatsClient, bucket: str) -> int:
    info = await nc.jetstream().stream_info(f"OBJ_{bucket}", subjects_filter=f"$O.{bucket}.C.>")
    return sum((info.state.subjects or {}).values())


async def test_objects_are_written_once_and_read_back_by_nats_py(nc: NatsClient, subject_prefix: str) -> None:
    bucket = f"{subject_prefix}_objects"
    store = await nc.jetstream().create_object_store(
        bucket, ObjectStoreConfig(bucket=bucket, storage=StorageType.MEMORY)
    )
    requester = Requester(nc)
    writer = ObjectWriter(requester, bucket, timeout=5)
    try:
        small, large = b"a snapshot", os.urandom(2 * CHUNK_SIZE + 10)  # one chunk; three chunks
        for data in (small, large):
            name = hashlib.sha256(data).hexdigest()
            assert await writer.put_once(name, data)
            result = await store.get(name)  # nats-py checks size and digest
            assert result.data == data
            assert result.info.chunks == -(-len(data) // CHUNK_SIZE)
        stored = await _chunk_messages(nc, bucket)
        assert stored == 1 + 3

        # Written again, alone or by two writers at once: nothing new is referenced, and no chunk is left over.
        name = hashlib.sha256(small).hexdigest()
        assert not await writer.put_once(name, small)
        other = ObjectWriter(requester, bucket, timeout=5)
        fresh = b"written by two at once"
        fresh_name = hashlib.sha256(fresh).hexdigest()
        assert sorted(
            await asyncio.gather(writer.put_once(fresh_name, fresh), other.put_once(fresh_name, fresh))
        ) == [
            False,
            True,
        ]
        assert (await store.get(fresh_name)).data == fresh
        assert await _chunk_messages(nc, bucket) == stored + 1
    finally:
        await requester.close()


async def test_objects_of_one_chunk_are_read_with_direct_gets_and_checked(
    nc: NatsClient, subject_prefix: str
) -> None:
    bucket = f"{subject_prefix}_objects"
    js = nc.jetstream()
    store = await js.create_object_store(bucket, ObjectStoreConfig(bucket=bucket, storage=StorageType.MEMORY))
    requester = Requester(nc)
    reader = ObjectReader(requester, bucket, timeout=5)
    try:
        await store.put("by-nats-py", b"written by nats-py")
        assert await reader.get("by-nats-py") == b"written by nats-py"
        assert await reader.get("missing") is None
        await store.put("large", os.urandom(CHUNK_SIZE + 1))
        with pytest.raises(MultipleChunks):
            await reader.get("large")  # left to nats-py's consumer-based read
        # A chunk that does not match its info (size or digest) is refused, never returned.
        info = await store.get_info("by-nats-py")
        await js.publish(f"$O.{bucket}.C.{info.nuid}", b"written by nats-pz")
        with pytest.raises(ObjectCorrupt):
            await reader.get("by-nats-py")
    finally:
        await requester.close()
