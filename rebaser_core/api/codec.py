"""Content types: ``application/cbor`` (the default) and ``application/json``.

A codec turns the JSON-compatible form of a message (``model_dump(mode="json")``) into bytes and back. Both
codecs carry the same data model, so a message converts losslessly between them.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import cbor2

from rebaser_core.errors import DecodeError, UnsupportedContentType

__all__ = ["ContentType", "decode_body", "encode_body"]


class ContentType(StrEnum):
    CBOR = "application/cbor"
    JSON = "application/json"

    @classmethod
    def parse(cls, value: str) -> ContentType:
        # Media types are case-insensitive and may carry parameters ("; charset=utf-8").
        base = value.split(";", 1)[0].strip().lower()
        try:
            return cls(base)
        except ValueError:
            raise UnsupportedContentType(value, tuple(c.value for c in cls)) from None


def encode_body(data: Any, content_type: ContentType) -> bytes:
    if content_type is ContentType.CBOR:
        return bytes(cbor2.dumps(data))
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def decode_body(body: bytes, content_type: ContentType) -> Any:
    """Bytes to JSON-compatible data; any failure becomes :class:`DecodeError`."""
    try:
        if content_type is ContentType.CBOR:
            return cbor2.loads(body)
        return json.loads(body)
    except (ValueError, TypeError, EOFError, RecursionError, OverflowError, MemoryError) as err:
        raise DecodeError(f"body is not valid {content_type.value}: {err}") from None
    except Exception as err:  # cbor2 raises a handful of its own types; never let one escape untyped
        raise DecodeError(f"body is not valid {content_type.value}: {type(err).__name__}: {err}") from None
