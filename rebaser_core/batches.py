"""Stored update batches: the v3 ``stored`` updates kind.

A batch too large to travel inside a request is written once to the ``REBASER_BATCHES`` object store under its
content address (the SHA-256 of its bytes), and the request carries only that address. The bytes are the JSON form
of :class:`~rebaser_core.api.InlineUpdates` (compact, keys sorted), so any language can write one.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import ValidationError

from rebaser_core.api import InlineUpdates, Update
from rebaser_core.errors import DecodeError

__all__ = ["ADDRESS_SCHEME", "batch_object_name", "decode_batch", "encode_batch"]

# An address may be written with its hash named, ``sha256:<hex>`` (docs/protocol.md §10 shows it so), or as the
# plain hex the client produces (§14); both name the same object, stored under the plain hex.
ADDRESS_SCHEME = "sha256:"


def batch_object_name(address: str) -> str:
    """The object-store name of a batch address given in either form (``sha256:<hex>`` or ``<hex>``)."""
    return address.removeprefix(ADDRESS_SCHEME)


def encode_batch(updates: list[Update]) -> tuple[str, bytes]:
    """The content address and bytes of a batch."""
    data = json.dumps(
        InlineUpdates(updates=updates).model_dump(mode="json"), sort_keys=True, separators=(",", ":")
    ).encode()
    return hashlib.sha256(data).hexdigest(), data


def decode_batch(address: str, data: bytes) -> list[Update]:
    """Parse a stored batch, checking it is the one its address names."""
    if hashlib.sha256(data).hexdigest() != batch_object_name(address):
        raise DecodeError(f"stored batch {address} does not match its content address")
    try:
        return InlineUpdates.model_validate_json(data).updates
    except ValidationError as err:
        raise DecodeError(
            f"stored batch {address} is not a valid update batch: {err.error_count()} errors"
        ) from None
