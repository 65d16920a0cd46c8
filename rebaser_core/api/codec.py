"""Content types: ``application/cbor`` (the default) and ``application/json``.

A codec turns the JSON-compatible form of a message (``model_dump(mode="json")``) into bytes and back. Both
codecs carry the same data model, so a message converts losslessly between them.

Decoding is bounded before anything walks the result (see ``docs/protocol.md`` §4): at most ``MAX_BODY_BYTES``,
``MAX_DEPTH`` nested arrays/maps and ``MAX_ITEMS`` values, and CBOR is pre-scanned (``cbor_scan``) so that tags,
which include cbor2's expanding shared references, never reach the decoder.
"""

from __future__ import annotations

import io
import json
import math
from enum import StrEnum
from typing import Any

import cbor2

from rebaser_core.api.cbor_scan import CborLimits, check_plain
from rebaser_core.errors import DecodeError, UnsupportedContentType

__all__ = ["MAX_BODY_BYTES", "MAX_DEPTH", "MAX_ITEMS", "ContentType", "decode_body", "encode_body"]


class ContentType(StrEnum):
    CBOR = "application/cbor"
    JSON = "application/json"

    @classmethod
    def parse(cls, value: str) -> ContentType:
        exact = _EXACT.get(value)  # what our own peers send: no parsing
        if exact is not None:
            return exact
        # Media types are case-insensitive and may carry parameters ("; charset=utf-8").
        base = value.split(";", 1)[0].strip().lower()
        try:
            return cls(base)
        except ValueError:
            raise UnsupportedContentType(value, tuple(c.value for c in cls)) from None


_EXACT: dict[str, ContentType] = {c.value: c for c in ContentType}


def encode_body(data: Any, content_type: ContentType) -> bytes:
    if content_type is ContentType.CBOR:
        return bytes(cbor2.dumps(data))
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


# Limits on one message body (requests, replies, queries), checked before the body is validated. 8 MiB is the
# largest max_payload NATS recommends; MAX_ITEMS allows inline batches of well over 10,000 updates.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 64
MAX_ITEMS = 250_000
_MAX_INT = 2**64
_LIMITS = CborLimits(max_depth=MAX_DEPTH, max_items=MAX_ITEMS)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _decode(body: bytes, content_type: ContentType) -> Any:
    if content_type is ContentType.JSON:
        return json.loads(body, parse_constant=_refuse_constant)
    check_plain(body, _LIMITS)  # refuses tags (shared references) and bounds depth and items first
    stream = io.BytesIO(body)
    data = cbor2.CBORDecoder(stream).decode()
    if stream.tell() != len(body):
        raise ValueError(f"{len(body) - stream.tell()} bytes of trailing data after the CBOR item")
    return data


class _Counter:
    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items = 0


def _check(value: Any, counter: _Counter, depth: int = 0, *, texts: bool = True) -> None:
    """Only the JSON data model crosses the wire: both codecs must be able to carry whatever we accept.

    ``texts=False`` for CBOR that ``check_plain`` cleared: cbor2 decodes text strictly (no lone surrogates) and,
    without tags, every integer is within 64 bits, so only the shape and the floats are left to check. Types are
    compared exactly (the decoders make nothing else), scalars without a call of their own: this walk runs on every
    request and every reply."""
    kind = type(value)
    # A container is refused where its members would be too deep (a container only ever comes from one at most
    # MAX_DEPTH - 1 deep, so this is the one depth check).
    if (kind is dict or kind is list) and value and depth >= MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")  # its members are one level deeper
    if kind is dict:
        counter.items += 1 + 2 * len(value)
        if counter.items > MAX_ITEMS:
            raise ValueError(f"more than {MAX_ITEMS} values")
        for key, item in value.items():
            if type(key) is not str:
                raise ValueError("map keys must be strings")
            if texts:
                key.encode("utf-8")  # lone surrogates raise UnicodeEncodeError, a ValueError
            _check_item(item, counter, depth + 1, texts)
    elif kind is list:
        counter.items += 1 + len(value)
        if counter.items > MAX_ITEMS:
            raise ValueError(f"more than {MAX_ITEMS} values")
        for item in value:
            _check_item(item, counter, depth + 1, texts)
    else:
        counter.items += 1
        _check_scalar(value, kind, texts)


def _check_item(value: Any, counter: _Counter, depth: int, texts: bool) -> None:
    """One member of an array or map (already counted, unless it is a container)."""
    kind = type(value)
    if kind is dict or kind is list:
        counter.items -= 1  # counted by the container above, and again by _check
        _check(value, counter, depth, texts=texts)
    else:
        _check_scalar(value, kind, texts)


def _check_scalar(value: Any, kind: type, texts: bool) -> None:
    if kind is str:
        if texts:
            value.encode("utf-8")  # lone surrogates raise UnicodeEncodeError, a ValueError
    elif kind is int:
        if texts and not -_MAX_INT <= value < _MAX_INT:  # what CBOR carries without bignum tags
            raise ValueError("integer outside -2**64 .. 2**64-1")
    elif kind is float:
        if not math.isfinite(value):
            raise ValueError("NaN and infinities are not allowed")
    elif value is not None and kind is not bool:
        raise ValueError(f"{kind.__name__} values are not part of the JSON data model")


def decode_body(body: bytes, content_type: ContentType) -> Any:
    """Bytes to JSON-compatible data; any failure becomes :class:`DecodeError`."""
    if len(body) > MAX_BODY_BYTES:
        raise DecodeError(f"body of {len(body)} bytes exceeds the limit of {MAX_BODY_BYTES} bytes")
    try:
        data = _decode(body, content_type)
        _check(data, _Counter(), texts=content_type is not ContentType.CBOR)
        return data
    except (ValueError, TypeError, EOFError, RecursionError, OverflowError, MemoryError) as err:
        raise DecodeError(f"body is not valid {content_type.value}: {err}") from None
    except Exception as err:  # cbor2 raises a handful of its own types; never let one escape untyped
        raise DecodeError(f"body is not valid {content_type.value}: {type(err).__name__}: {err}") from None
