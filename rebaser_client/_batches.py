"""Storing an update batch too large for a request (docs/protocol.md §14): its parts, then its manifest, on the
workspace's subjects of ``REBASER_STORED_BATCHES``."""

from __future__ import annotations

import asyncio

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js.errors import APIError

from rebaser_core.api import StoredUpdates, Update
from rebaser_core.batches import MANIFEST, Manifest, encode_batch, split_parts
from rebaser_core.errors import RebaserBusy, RebaserUnavailable
from rebaser_core.ids import WorkspacePk
from rebaser_core.nats.tasks import STREAM_FULL, STREAM_FULL_RETRY_AFTER, ensure_connected
from rebaser_core.subjects import Subjects

__all__ = ["store_batch"]

_PARALLEL_PARTS = 8


async def store_batch(
    nc: NatsClient,
    subjects: Subjects,
    workspace_id: WorkspacePk,
    updates: list[Update],
    *,
    max_updates: int,
    max_bytes: int,
) -> StoredUpdates:
    """``RebaserClient.store_batch``: BatchTooLarge before anything is sent, RebaserUnavailable if NATS fails."""
    address, data = encode_batch(updates, max_updates=max_updates, max_bytes=max_bytes)
    ensure_connected(nc, f"storing batch {address}")
    js = nc.jetstream()
    stream = subjects.stored_batches_stream
    parts = split_parts(data)

    async def put(part: int | str, payload: bytes) -> None:
        await js.publish(subjects.batch_part(workspace_id, address, part), payload, stream=stream)

    try:
        # The parts first, a few at a time; the manifest last, once every part is acknowledged: a batch whose
        # manifest a daemon finds is whole.
        for start in range(0, len(parts), _PARALLEL_PARTS):
            window = range(start, min(start + _PARALLEL_PARTS, len(parts)))
            await asyncio.gather(*(put(n, parts[n]) for n in window))
        await put(MANIFEST, Manifest(size=len(data), parts=len(parts)).encode())
    except APIError as err:
        if err.err_code in STREAM_FULL:
            # The stream every workspace shares is full (stored_batches_max_msgs or _max_bytes): the daemons' batch
            # sweep trims workspaces over their share, and old batches age out (docs/capacity.md#bounds).
            raise RebaserBusy(
                f"storing batch {address} refused: the stored batches stream is full "
                f"(stored_batches_max_msgs); retry after {STREAM_FULL_RETRY_AFTER:g}s "
                f"(nats-server: {err.description!r}, err_code {err.err_code})",
                retry_after=STREAM_FULL_RETRY_AFTER,
                limit="stored_batches",
            ) from None
        raise RebaserUnavailable(f"storing batch {address} failed: {err}") from None
    except nats.errors.Error as err:
        raise RebaserUnavailable(f"storing batch {address} failed: {err}") from None
    return StoredUpdates(address=address)
