"""Snapshots and stored batches in JetStream Object Stores: content-addressed, written once, cached."""

from __future__ import annotations

from collections import OrderedDict

from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.object_store import ObjectStore

from rebaser_core.api import Update
from rebaser_core.batches import batch_object_name, decode_batch
from rebaser_core.errors import DecodeError, UnprocessableError
from rebaser_core.settings import Settings
from rebaser_server.apps.snapshots.model import Snapshot

__all__ = ["SnapshotStore"]


async def open_object_store(js: JetStreamContext, name: str, settings: Settings) -> ObjectStore:
    try:
        return await js.object_store(name)
    except BucketNotFoundError:
        storage = StorageType.FILE if settings.storage == "file" else StorageType.MEMORY
        return await js.create_object_store(
            name, ObjectStoreConfig(bucket=name, storage=storage, replicas=settings.replicas)
        )


class SnapshotStore:
    def __init__(self, js: JetStreamContext, settings: Settings, *, cache_size: int = 1024) -> None:
        self._js = js
        self._settings = settings
        self._snapshots: ObjectStore | None = None
        self._batches: ObjectStore | None = None
        # Snapshots are immutable, so a cache never goes stale; it only saves reads.
        self._cache: OrderedDict[str, Snapshot] = OrderedDict()
        self._cache_size = cache_size
        self._written: set[str] = set()

    async def open(self) -> None:
        subjects = self._settings.subjects
        self._snapshots = await open_object_store(self._js, subjects.snapshots_bucket, self._settings)
        self._batches = await open_object_store(self._js, subjects.batches_bucket, self._settings)

    def _remember(self, address: str, snapshot: Snapshot) -> None:
        self._cache[address] = snapshot
        self._cache.move_to_end(address)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def put(self, snapshot: Snapshot) -> str:
        """Write ``snapshot`` unless that address is already stored; return its address."""
        assert self._snapshots is not None
        data = snapshot.encode()
        address = Snapshot.address_of(data)
        if address not in self._written:
            try:
                await self._snapshots.get_info(address)
            except NotFoundError:
                await self._snapshots.put(address, data)
            self._written.add(address)
        self._remember(address, snapshot)
        return address

    async def get(self, address: str) -> Snapshot:
        cached = self._cache.get(address)
        if cached is not None:
            self._cache.move_to_end(address)
            return cached
        assert self._snapshots is not None
        result = await self._snapshots.get(address)
        assert result.data is not None
        snapshot = Snapshot.decode(result.data)
        self._remember(address, snapshot)
        return snapshot

    async def get_batch(self, address: str) -> list[Update]:
        assert self._batches is not None
        try:
            result = await self._batches.get(batch_object_name(address))
        except NotFoundError:
            raise UnprocessableError(f"stored batch {address} does not exist") from None
        assert result.data is not None
        try:
            return decode_batch(address, result.data)
        except DecodeError as err:
            raise UnprocessableError(str(err)) from None
