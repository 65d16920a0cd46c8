"""What an app may read besides the change set it applies: another change set's committed state, and the stored
batch a request names. :class:`StoreReader` is the daemon's :class:`~rebaser_server.app.ChangeSetReader`; every
:class:`~rebaser_server.app.ChangeSet` the daemon hands an app carries it."""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.object_store import ObjectStore

from rebaser_core.api import Update
from rebaser_core.batches import MANIFEST, Manifest, batch_object_name, decode_batch, is_address
from rebaser_core.errors import DecodeError, UnprocessableError
from rebaser_core.ids import WorkspacePk
from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet, Committed
from rebaser_server.record.store import ChangeSetStore

__all__ = ["OFF_LOOP_BYTES", "StoreReader"]

OFF_LOOP_BYTES = 256 * 1024
"""A batch larger than this is decoded in a worker thread; a smaller one costs less than the thread hop."""
_PARALLEL_READS = 8


class StoreReader:
    """Reads the change sets' records and the stored batches: a request's batch from its workspace's part of
    ``REBASER_STORED_BATCHES`` (which the daemon creates so that clients can write to it), else from the first
    layout's object store ``REBASER_BATCHES`` if the deployment still has one (docs/protocol.md §14)."""

    def __init__(self, js: JetStreamContext, settings: Settings, store: ChangeSetStore) -> None:
        self._js = js
        self._settings = settings
        self._store = store
        self._legacy: ObjectStore | None = None

    async def open(self) -> None:
        """Nothing to open: kept so the daemon's start-up reads the same for its readers."""

    async def committed(self, change_set: ChangeSet) -> Committed | None:
        record = await self._store.read(change_set)
        return None if record is None else Committed(change_set, record.state)

    async def stored_updates(self, workspace_id: WorkspacePk, address: str) -> list[Update]:
        """The updates of a batch stored for ``workspace_id``; ``UnprocessableError`` if it is missing, corrupt
        or over the limits (``max_stored_batch_bytes``: its declared size is checked before any of it is read, its
        real size after; ``max_updates_per_request``: counted before any update is validated)."""
        name = batch_object_name(address)
        if not is_address(name):
            raise UnprocessableError(f"stored batch {address} does not exist")  # no SHA-256 is named so
        data = await self._read_parts(workspace_id, name, address)
        if data is None:
            data = await self._read_legacy(name, address)
        max_updates = self._settings.max_updates_per_request
        try:
            if len(data) > OFF_LOOP_BYTES:
                return await asyncio.to_thread(decode_batch, address, data, max_updates=max_updates)
            return decode_batch(address, data, max_updates=max_updates)
        except DecodeError as err:
            raise UnprocessableError(str(err)) from None

    async def _read_parts(self, workspace_id: WorkspacePk, name: str, address: str) -> bytes | None:
        """The batch from the workspace's stored batches; None if the workspace has none under this address."""
        subjects = self._settings.subjects
        stream = subjects.stored_batches_stream
        try:
            # From the leader: a follower may not have the manifest yet that the client's write was acked for.
            raw = await self._js.get_last_msg(stream, subjects.batch_part(workspace_id, name, MANIFEST))
        except NotFoundError:  # no such message, or (an older deployment's daemons) no such stream
            return None
        try:
            manifest = Manifest.decode(raw.data or b"")
        except DecodeError as err:
            raise UnprocessableError(f"stored batch {address}: {err}") from None
        self._check_size(address, manifest.size)
        parts: list[bytes] = []
        for start in range(0, manifest.parts, _PARALLEL_READS):
            window = range(start, min(start + _PARALLEL_READS, manifest.parts))
            parts += await asyncio.gather(*(self._read_part(workspace_id, name, n) for n in window))
        missing = [n for n, part in enumerate(parts) if not part]
        if missing:
            raise UnprocessableError(f"stored batch {address} is missing parts {missing[:5]}")
        data = b"".join(parts)
        if len(data) != manifest.size:
            raise UnprocessableError(
                f"stored batch {address} has {len(data)} bytes, its manifest says {manifest.size}"
            )
        return data

    async def _read_part(self, workspace_id: WorkspacePk, name: str, part: int) -> bytes:
        subjects = self._settings.subjects
        subject = subjects.batch_part(workspace_id, name, part)
        for direct in (True, False):  # any replica first; the leader if that one has not caught up
            try:
                raw = await self._js.get_last_msg(subjects.stored_batches_stream, subject, direct=direct)
            except NotFoundError:
                continue
            return raw.data or b""
        return b""

    async def _read_legacy(self, name: str, address: str) -> bytes:
        if self._legacy is None:
            try:
                self._legacy = await self._js.object_store(self._settings.subjects.batches_bucket)
            except BucketNotFoundError:
                raise UnprocessableError(f"stored batch {address} does not exist") from None
        try:
            info = await self._legacy.get_info(name)
            self._check_size(address, info.size or 0)
            result = await self._legacy.get(name)
        except NotFoundError:
            raise UnprocessableError(f"stored batch {address} does not exist") from None
        data = result.data
        assert data is not None
        self._check_size(address, len(data))
        return data

    def _check_size(self, address: str, size: int) -> None:
        max_bytes = self._settings.max_stored_batch_bytes
        if size > max_bytes:
            raise UnprocessableError(
                f"stored batch {address} has {size} bytes, over the limit of {max_bytes} (max_stored_batch_bytes)"
            )
