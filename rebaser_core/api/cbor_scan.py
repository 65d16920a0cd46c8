"""A bounded, iterative pre-scan of untrusted CBOR, run before cbor2 decodes anything.

cbor2 honours the value-sharing tags 28/29 (and string references, 25/256) *inside* its decoder, before any
``tag_hook`` is consulted: about 300 bytes can name a structure 2**40 nodes wide, and whatever walks the decoded
value (our checks, pydantic) never finishes. Rather than patch cbor2's C decoder, the bytes are walked first by
this small scanner, which looks at every data item head once (strings are skipped by length, never copied) and
refuses what the protocol does not allow: any tag, byte strings, simple values other than
``false``/``true``/``null``, more than ``max_items`` items and more than ``max_depth`` nested arrays/maps. A body
that passes is a plain tree whose size is bounded by its length, so decoding and validating it is bounded too.
The walk is iterative, so deep nesting cannot exhaust the Python stack either.

The walk is Python, a dozen microseconds for a small message. :func:`check_plain` first tries a proof that needs no
walk, made of two byte counts at C speed: with no byte in ``0xC0..0xDF`` there can be no tag head, every item takes
at least one byte and every array or map head is a byte in ``0x80..0xBF``, so few enough of those bound the depth.
Byte strings and other simple values can then still reach the decoder, bounded by the length as well; the caller
refuses them in the decoded value (``codec._check``).
"""

from __future__ import annotations

from dataclasses import dataclass

import cbor2

__all__ = ["DECODER_BOUNDS_DEPTH", "CborLimits", "check_plain", "scan_item", "untagged"]

# A container whose length is not known in advance (indefinite-length encoding) ends with a "break" byte.
_INDEFINITE = -1
_BREAK = 0xFF
_FALSE, _TRUE, _NULL = 20, 21, 22
_FLOAT_SIZES = {25: 2, 26: 4, 27: 8}


@dataclass(frozen=True, slots=True)
class CborLimits:
    """What one CBOR data item may contain. ``None`` means "no limit" (the length of the bytes still bounds it)."""

    max_depth: int = 64
    max_items: int | None = None


# Deleted from the bytes, these leave only what could start a tag (major type 6: 0xC0..0xDB, and the reserved
# 0xDC..0xDF), or a tag or an array or map (major types 4 and 5: 0x80..0xBF); and the container heads alone. Byte
# deletions run at C speed: a regular expression search for a tag head takes longer than two of them.
_NOT_TAG_HEADS = bytes(b for b in range(256) if not 0xC0 <= b <= 0xDF)
_NOT_CONTAINER_OR_TAG_HEADS = bytes(b for b in range(256) if not 0x80 <= b <= 0xDF)
_CONTAINER_HEADS = bytes(range(0x80, 0xC0))


def _decoder_bounds_depth() -> bool:
    """Whether cbor2's decoder refuses deep nesting by itself (cbor2 6 does, past 400 levels): then a deep body
    cannot exhaust the stack, and only tags can make decoding expand."""
    try:
        cbor2.loads(b"\x81" * 1000 + b"\x00")
    except cbor2.CBORDecodeError:
        return True
    except RecursionError:
        pass
    return False


DECODER_BOUNDS_DEPTH = _decoder_bounds_depth()


def untagged(data: bytes) -> bool:
    """True if no byte of ``data`` could start a tag: decoding it cannot expand (no shared references)."""
    return not data.translate(None, _NOT_TAG_HEADS)


def check_plain(data: bytes, limits: CborLimits) -> None:
    """Make sure decoding ``data`` cannot expand: no tag, at most ``limits`` depth and items. Cheap when the bytes
    alone prove it (see the module docstring); otherwise :func:`scan_item`, which also refuses byte strings and
    simple values. Raises ``ValueError``."""
    if limits.max_items is None or len(data) <= limits.max_items:
        heads = data.translate(None, _NOT_CONTAINER_OR_TAG_HEADS)  # container and tag heads, in order
        if len(heads) <= limits.max_depth and not heads.translate(None, _CONTAINER_HEADS):
            return  # no tag head, and too few container heads to nest deeper than allowed
    scan_item(data, 0, limits)


def scan_item(data: bytes, start: int, limits: CborLimits) -> int:
    """Check the CBOR data item at ``start``; return the offset just past it. Raises ``ValueError``."""
    pos, end, items = start, len(data), 0
    # Items still expected by each open container (a map expects two per entry), innermost last; the bottom
    # entry is the single top-level item.
    open_: list[int] = [1]
    while open_:
        if open_[-1] == 0:
            open_.pop()
            continue
        if pos >= end:
            raise ValueError("truncated CBOR data")
        initial = data[pos]
        if initial == _BREAK:
            if open_[-1] != _INDEFINITE:
                raise ValueError(f"unexpected break code at offset {pos}")
            pos += 1
            open_.pop()
            continue
        if open_[-1] != _INDEFINITE:
            open_[-1] -= 1
        items += 1
        if limits.max_items is not None and items > limits.max_items:
            raise ValueError(f"more than {limits.max_items} CBOR data items")
        major, info = initial >> 5, initial & 0x1F
        pos, argument = _head(data, pos, major, info)
        if major in (0, 1):  # unsigned and negative integers: the head is the whole item
            continue
        if major == 2:
            raise ValueError("byte strings are not part of the JSON data model")
        if major == 3:  # text string, or the chunks of an indefinite one
            if argument == _INDEFINITE:
                open_.append(_INDEFINITE)  # chunks are text strings themselves; cbor2 checks their kind
            else:
                pos = _skip(data, pos, argument)
            continue
        if major in (4, 5):
            if argument != _INDEFINITE:
                # Every item takes at least one byte: a count beyond the remaining bytes is a lie (or a bomb).
                if argument > end - pos:
                    raise ValueError(f"container of {argument} items in {end - pos} remaining bytes")
                argument *= 2 if major == 5 else 1
            open_.append(argument)
            if len(open_) - 1 > limits.max_depth:
                raise ValueError(f"nested deeper than {limits.max_depth} levels")
            continue
        if major == 6:
            # Tags 28/29 (shared values) and 25/256 (string references) expand on decoding; the others are
            # not JSON. None is allowed: refusing every tag needs no list of the dangerous ones.
            raise ValueError(f"CBOR tag {argument} is not allowed")
        # Major type 7: simple values and floats.
        if info in (_FALSE, _TRUE, _NULL) or info in _FLOAT_SIZES:
            continue
        raise ValueError(f"CBOR simple value {argument} is not allowed")
    return pos


def _head(data: bytes, pos: int, major: int, info: int) -> tuple[int, int]:
    """Offset past the item's head and its argument (``_INDEFINITE`` for an indefinite length)."""
    pos += 1
    if info < 24:
        return pos, info
    if major == 7 and info in _FLOAT_SIZES:
        return _skip(data, pos, _FLOAT_SIZES[info]), info
    if 24 <= info <= 27:
        size = 1 << (info - 24)
        after = _skip(data, pos, size)
        return after, int.from_bytes(data[pos:after], "big")
    if info == 31 and major in (2, 3, 4, 5):
        return pos, _INDEFINITE
    raise ValueError(f"malformed CBOR head 0x{(major << 5) | info:02x} at offset {pos - 1}")


def _skip(data: bytes, pos: int, length: int) -> int:
    if length > len(data) - pos:
        raise ValueError("truncated CBOR data")
    return pos + length
