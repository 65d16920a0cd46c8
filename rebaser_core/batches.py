"""Stored update batches: the v3 ``stored`` updates kind.

A batch too large to travel inside a request is written once, under its workspace and its content address (the
SHA-256 of its bytes), and the request carries only that address. The bytes are the JSON form of
:class:`~rebaser_core.api.InlineUpdates` (compact, keys sorted), so any language can write one.

**Layout** (docs/protocol.md §14). The ``REBASER_STORED_BATCHES`` stream keeps one message per subject: the
batch's parts of at most :data:`PART_BYTES` on ``rebaser.batches.<wk>.<address>.<0, 1, …>``, then its manifest
(:class:`Manifest`) on ``….manifest``, written last so that a batch without one does not exist yet. The workspace
token lets nats-server confine a caller to its workspace's batches; the daemon reads a request's batch from the
request's workspace only. The first layout, an object store named by address alone (``REBASER_BATCHES``), is
still read when a workspace has no such batch: see :func:`is_address` for what may be looked up at all.

A batch has at most :data:`MAX_BATCH_UPDATES` updates and :data:`MAX_BATCH_BYTES` bytes (the daemon's
``max_updates_per_request`` and ``max_stored_batch_bytes`` default to these): a million-update batch takes a
daemon 30 s and a gigabyte to load. The client refuses to store a larger one (:class:`BatchTooLarge`); a daemon
refuses a request naming one, counting the updates before it validates any of them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError

from rebaser_core.api import InlineUpdates, Update
from rebaser_core.errors import BatchTooLarge, DecodeError

__all__ = [
    "ADDRESS_SCHEME",
    "MANIFEST",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_UPDATES",
    "PART_BYTES",
    "Manifest",
    "batch_object_name",
    "decode_batch",
    "encode_batch",
    "is_address",
    "split_parts",
]

MAX_BATCH_UPDATES = 100_000
MAX_BATCH_BYTES = 16 * 1024 * 1024

PART_BYTES = 256 * 1024
"""A stored batch's parts have at most this many bytes (NATS' default max payload is 1 MiB)."""
MANIFEST = "manifest"
"""The last subject token of a batch's manifest (its parts are 0, 1, …)."""
_MANIFEST_MAX_BYTES = 256
_HEX_ADDRESS = re.compile(r"[0-9a-f]{64}")

_UPDATES: TypeAdapter[list[Update]] = TypeAdapter(list[Update])
_SLICE = 500

# An address may be written with its hash named, ``sha256:<hex>`` (docs/protocol.md §10 shows it so), or as the
# plain hex the client produces (§14); both name the same object, stored under the plain hex.
ADDRESS_SCHEME = "sha256:"


def batch_object_name(address: str) -> str:
    """The object-store name of a batch address given in either form (``sha256:<hex>`` or ``<hex>``)."""
    return address.removeprefix(ADDRESS_SCHEME)


def is_address(name: str) -> bool:
    """Whether ``name`` (an address without its ``sha256:``) can name a batch: 64 lowercase hex digits. Anything
    else never hashed to a stored batch, and is never put in a subject (a ``*`` or ``.`` there would reach others)."""
    return _HEX_ADDRESS.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a stored batch's manifest says: its size and how many parts hold it. Written after every part."""

    size: int
    parts: int

    def encode(self) -> bytes:
        return json.dumps({"parts": self.parts, "size": self.size}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        """Parse and check a manifest: :class:`DecodeError` unless ``parts`` of :data:`PART_BYTES` hold ``size``
        bytes exactly (so the parts to read are known, and bounded, before any is read)."""
        if len(data) > _MANIFEST_MAX_BYTES:
            raise DecodeError(
                f"a batch manifest has at most {_MANIFEST_MAX_BYTES} bytes, this one {len(data)}"
            )
        try:
            raw = json.loads(data)
        except ValueError:
            raise DecodeError("a batch manifest is not JSON") from None
        size = raw.get("size") if isinstance(raw, dict) else None
        parts = raw.get("parts") if isinstance(raw, dict) else None
        if type(size) is not int or type(parts) is not int or size < 1 or parts != -(-size // PART_BYTES):
            raise DecodeError(
                f"a batch manifest must give a size and its parts of {PART_BYTES} bytes: {raw!r}"
            )
        return cls(size, parts)


def split_parts(data: bytes) -> list[bytes]:
    """A batch's bytes cut into its stored parts."""
    return [data[start : start + PART_BYTES] for start in range(0, len(data), PART_BYTES)]


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
