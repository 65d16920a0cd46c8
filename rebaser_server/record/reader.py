"""What an app may read besides the change set it applies: another change set's committed state, and the stored
batch a request names. :class:`StoreReader` is the daemon's :class:`~rebaser_server.app.ChangeSetReader`; every
:class:`~rebaser_server.app.ChangeSet` the daemon hands an app carries it."""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from rebaser_core.api import Update
from rebaser_core.batches import batch_object_name, decode_batch
from rebaser_core.errors import DecodeError, UnprocessableError
from rebaser_core.settings import Settings
from rebaser_core.streams import open_object_store
from rebaser_server.app import ChangeSet, Committed
from rebaser_server.record.store import ChangeSetStore

__all__ = ["OFF_LOOP_BYTES", "StoreReader"]

OFF_LOOP_BYTES = 256 * 1024
"""A batch larger than this is decoded in a worker thread; a smaller one costs less than the thread hop."""


class StoreReader:
    """Reads the change sets' records and the stored batches (``REBASER_BATCHES``, which the daemon creates so
    that clients can write to it)."""

    def __init__(self, js: JetStreamContext, settings: Settings, store: ChangeSetStore) -> None:
        self._js = js
        self._settings = settings
        self._store = store
        self._batches: ObjectStore | None = None

    async def open(self) -> None:
        self._batches = await open_object_store(
            self._js, self._settings.subjects.batches_bucket, self._settings
        )

    async def committed(self, change_set: ChangeSet) -> Committed | None:
        record = await self._store.read(change_set)
        return None if record is None else Committed(change_set, record.state)

    async def stored_updates(self, address: str) -> list[Update]:
        """The updates of a stored batch; ``UnprocessableError`` if it is missing, corrupt or over the limits
        (``max_stored_batch_bytes``: its declared size is checked before it is downloaded, its real size after;
        ``max_updates_per_request``: counted before any update is validated)."""
        if self._batches is None:
            await self.open()
        assert self._batches is not None
        max_bytes = self._settings.max_stored_batch_bytes
        try:
            info = await self._batches.get_info(batch_object_name(address))
            if (info.size or 0) > max_bytes:
                raise UnprocessableError(
                    f"stored batch {address} has {info.size} bytes, over the limit of {max_bytes} "
                    "(max_stored_batch_bytes)"
                )
            result = await self._batches.get(batch_object_name(address))
        except NotFoundError:
            raise UnprocessableError(f"stored batch {address} does not exist") from None
        data = result.data
        assert data is not None
        if len(data) > max_bytes:
            raise UnprocessableError(f"stored batch {address} is over the limit of {max_bytes} bytes")
        max_updates = self._settings.max_updates_per_request
        try:
            if len(data) > OFF_LOOP_BYTES:
                return await asyncio.to_thread(decode_batch, address, data, max_updates=max_updates)
            return decode_batch(address, data, max_updates=max_updates)
        except DecodeError as err:
            raise UnprocessableError(str(err)) from None
