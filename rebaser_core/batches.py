"""Stored update batches: the v3 ``stored`` updates kind.

A batch too large to travel inside a request is written once to the ``REBASER_BATCHES`` object store under its
content address (the SHA-256 of its bytes), and the request carries only that address. The bytes are the JSON form
of :class:`~rebaser_core.api.InlineUpdates` (compact, keys sorted), so any language can write one.

A batch has at most :data:`MAX_BATCH_UPDATES` updates and :data:`MAX_BATCH_BYTES` bytes (the daemon's
``max_updates_per_request`` and ``max_stored_batch_bytes`` default to these): a million-update batch takes a
daemon 30 s and a gigabyte to load. The client refuses to store a larger one (:class:`BatchTooLarge`); a daemon
refuses a request naming one, counting the updates before it validates any of them.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import TypeAdapter, ValidationError

from rebaser_core.api import InlineUpdates, Update
from rebaser_core.errors import BatchTooLarge, DecodeError

__all__ = [
    "ADDRESS_SCHEME",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_UPDATES",
    "batch_object_name",
    "decode_batch",
    "encode_batch",
]

MAX_BATCH_UPDATES = 100_000
MAX_BATCH_BYTES = 16 * 1024 * 1024

_UPDATES: TypeAdapter[list[Update]] = TypeAdapter(list[Update])
_SLICE = 500

# An address may be written with its hash named, ``sha256:<hex>`` (docs/protocol.md §10 shows it so), or as the
# plain hex the client produces (§14); both name the same object, stored under the plain hex.
ADDRESS_SCHEME = "sha256:"


def batch_object_name(address: str) -> str:
    """The object-store name of a batch address given in either form (``sha256:<hex>`` or ``<hex>``)."""
    return address.removeprefix(ADDRESS_SCHEME)


def encode_batch(
    updates: list[Update], *, max_updates: int = MAX_BATCH_UPDATES, max_bytes: int = MAX_BATCH_BYTES
) -> tuple[str, bytes]:
    """The content address and bytes of a batch; :class:`BatchTooLarge` if it is over a limit."""
    if len(updates) > max_updates:
        raise BatchTooLarge(
            f"a batch has at most {max_updates} updates, this one {len(updates)}",
            "updates",
            len(updates),
            max_updates,
        )
    data = json.dumps(
        InlineUpdates(updates=updates).model_dump(mode="json"), sort_keys=True, separators=(",", ":")
    ).encode()
    if len(data) > max_bytes:
        raise BatchTooLarge(
            f"a batch has at most {max_bytes} bytes, this one {len(data)}", "bytes", len(data), max_bytes
        )
    return hashlib.sha256(data).hexdigest(), data


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


def decode_batch(address: str, data: bytes, *, max_updates: int = MAX_BATCH_UPDATES) -> list[Update]:
    """Parse a stored batch, checking it is the one its address names and has at most ``max_updates`` updates.

    CPU-heavy for a large batch (about 30 µs an update): call it off the event loop."""
    if hashlib.sha256(data).hexdigest() != batch_object_name(address):
        raise DecodeError(f"stored batch {address} does not match its content address")
    try:
        raw = json.loads(data, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as err:
        raise DecodeError(f"stored batch {address} is not JSON: {type(err).__name__}") from None
    updates = raw.get("updates") if isinstance(raw, dict) else None
    # Count before validating: validation is what costs (a million updates take 30 s).
    if isinstance(updates, list) and len(updates) > max_updates:
        raise DecodeError(
            f"stored batch {address} has {len(updates)} updates, over the limit of {max_updates}"
        )
    try:
        InlineUpdates.model_validate({**raw, "updates": []} if isinstance(raw, dict) else raw)
        if not isinstance(updates, list):
            raise DecodeError(f"stored batch {address} is not a valid update batch: no list of updates")
        # In slices: one validation call holds the GIL throughout (a million updates: 30 s), and so would stall
        # the event loop even from a worker thread; between slices the loop gets its turn.
        parsed: list[Update] = []
        for start in range(0, len(updates), _SLICE):
            parsed += _UPDATES.validate_python(updates[start : start + _SLICE])
    except ValidationError as err:
        raise DecodeError(
            f"stored batch {address} is not a valid update batch: {err.error_count()} errors"
        ) from None
    return parsed
