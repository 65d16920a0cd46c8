"""Snapshots in a JetStream Object Store: content-addressed, written once, cached.

A small snapshot is not written here at all: the app keeps it in its change set's record (``SnapshotApp``), and
hands it to :meth:`SnapshotStore.get` to decode and cache.

Decoding a large snapshot is CPU work: it runs in a worker thread so the event loop (health, progress
acks, other change sets) keeps being served.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from rebaser_core.nats.requester import Requester
from rebaser_core.nats.streams import open_object_store
from rebaser_core.settings import Settings
from rebaser_server.apps.snapshots.model import Snapshot
from rebaser_server.apps.snapshots.objects import MultipleChunks, ObjectCorrupt, ObjectReader, ObjectWriter

__all__ = ["CACHE_BYTES", "CACHE_SIZE", "OFF_LOOP_BYTES", "SnapshotStore"]

OFF_LOOP_BYTES = 256 * 1024
"""Data larger than this is decoded in a worker thread; smaller data costs less than the thread hop."""

CACHE_SIZE = 16_384
"""The snapshot cache holds at most this many snapshots: one for each of far more change sets than a daemon owns at
once (a miss costs a read from the object store); the byte bound below is what keeps memory in check."""

CACHE_BYTES = 256 * 1024 * 1024
"""The snapshot cache holds at most this many bytes of snapshots (their encoded size; in memory they take more:
the decoded objects, and each attribute's kept JSON text, about the encoded size again)."""


class SnapshotStore:
    def __init__(
        self,
        js: JetStreamContext,
        settings: Settings,
        *,
        requester: Requester | None = None,
        cache_size: int = CACHE_SIZE,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        self._js = js
        self._settings = settings
        self._snapshots: ObjectStore | None = None
        self._requester = requester
        # Snapshot writes and reads (objects.py); None: through nats-py's ObjectStore (no requester given).
        self._writer: ObjectWriter | None = None
        self._reader: ObjectReader | None = None
        # Snapshots are immutable, so a cache never goes stale; it only saves reads. With each its encoded size.
        self._cache: OrderedDict[str, tuple[Snapshot, int]] = OrderedDict()
        self._cache_size = cache_size
        self._cache_bytes = cache_bytes
        self._cached_bytes = 0
        # Addresses this store wrote (or found stored), so a snapshot written again (a change set back to an
        # earlier state) costs no round trip. At most cache_size of them, the newest: a large change set writes a
        # new snapshot per group, and a set of every one of them would grow for as long as the daemon runs. Forgetting
        # one costs only the write's "stored already?" check.
        self._written: OrderedDict[str, None] = OrderedDict()

    async def open(self) -> None:
        subjects = self._settings.subjects
        self._snapshots = await open_object_store(self._js, subjects.snapshots_bucket, self._settings)
        if self._requester is not None:
            bucket, timeout = subjects.snapshots_bucket, self._settings.nats_timeout
            self._writer = ObjectWriter(self._requester, bucket, timeout=timeout)
            self._reader = ObjectReader(self._requester, bucket, timeout=timeout)

    def remember(self, address: str, snapshot: Snapshot, size: int) -> None:
        """Cache ``snapshot`` (encoded in ``size`` bytes) as the one at ``address``. Also called without a write,
        for a snapshot its change-set record keeps (``inline``), which the next read would otherwise decode from
        that copy."""
        previous = self._cache.pop(address, None)
        self._cached_bytes += size - (0 if previous is None else previous[1])
        self._cache[address] = (snapshot, size)
        # Bounded in bytes too: a thousand snapshots at the size limit would not fit in memory. The newest stays.
        while len(self._cache) > 1 and (
            len(self._cache) > self._cache_size or self._cached_bytes > self._cache_bytes
        ):
            _, (_, evicted) = self._cache.popitem(last=False)
            self._cached_bytes -= evicted

    def size(self, address: str) -> int | None:
        """The encoded size of a snapshot this store has in its cache, else None."""
        cached = self._cache.get(address)
        return None if cached is None else cached[1]

    async def put(self, snapshot: Snapshot, data: bytes | None = None) -> str:
        """Write ``snapshot`` (whose encoding is ``data``, if already known) unless that address is already stored;
        return its address."""
        assert self._snapshots is not None
        if data is None:
            data = snapshot.encode()
        address = Snapshot.address_of(data)
        if address in self._written:
            self._written.move_to_end(address)
        else:
            if self._writer is not None:
                await self._writer.put_once(address, data)  # written unless stored already, in one go
            else:
                try:
                    await self._snapshots.get_info(address)
                except NotFoundError:
                    await self._snapshots.put(address, data)
            self._written[address] = None
            if len(self._written) > self._cache_size:
                self._written.popitem(last=False)
        self.remember(address, snapshot, len(data))
        return address

    async def get(self, address: str, inline: bytes | None = None) -> Snapshot:
        """The snapshot at ``address``: cached, else decoded from ``inline`` (the copy a change-set record keeps of
        a small snapshot, which is then not in the object store), else read from the object store."""
        cached = self._cache.get(address)
        if cached is not None:
            self._cache.move_to_end(address)
            return cached[0]
        if inline is not None:
            # A record is read back as untrusted bytes: a copy that is not what its address names is refused
            # rather than trusted (nor looked for in the object store, where it was never written).
            if Snapshot.address_of(inline) != address:
                raise ObjectCorrupt(
                    f"snapshot {address}: the copy in the change-set record does not match it"
                )
            data = inline
        else:
            data = await self._read(address)
        snapshot = (
            await asyncio.to_thread(Snapshot.decode, data)
            if len(data) > OFF_LOOP_BYTES
            else Snapshot.decode(data)
        )
        self.remember(address, snapshot, len(data))
        return snapshot

    async def _read(self, address: str) -> bytes:
        assert self._snapshots is not None
        if self._reader is not None:
            try:
                data = await self._reader.get(address)
            except MultipleChunks:
                pass  # over 128 KiB: nats-py reads the chunks through a consumer
            else:
                if data is None:
                    raise NotFoundError
                return data
        result = await self._snapshots.get(address)
        assert result.data is not None
        return result.data
