"""Hostile wire input shared by the hostile-input tests: CBOR bombs and friends."""

from __future__ import annotations

import cbor2


def _tag(number: int) -> bytes:
    return bytes([0xD8, number])  # a tag with a one-byte number (24..255)


def _uint(value: int) -> bytes:
    return bytes([value]) if value < 24 else bytes([0x18, value])


def shared_bomb(depth: int) -> bytes:
    """A CBOR array nested ``depth`` levels, each level an array of the same child twice, by shared reference
    (tags 28/29): a few bytes per level, 2**depth nodes once decoded and walked."""
    body = _tag(28) + cbor2.dumps("x")  # the leaf, shareable number ``depth``
    for level in reversed(range(depth)):
        # Level k is shareable number k (numbered in decoding order, outermost first); its second element refers
        # back to its first, level k+1 (the innermost level refers to the leaf string, shareable number depth).
        body = _tag(28) + b"\x82" + body + _tag(29) + _uint(level + 1)
    return body


def request_bomb(depth: int, request_id: str, workspace_id: str, change_set_id: str) -> bytes:
    """An EnqueueUpdatesRequest v3 body whose ``updates`` is a shared-reference bomb."""
    head = cbor2.dumps({"id": request_id, "workspace_id": workspace_id, "change_set_id": change_set_id})
    # Append one more map entry by hand: the bomb is raw CBOR, not a Python value.
    assert head[0] == 0xA3
    return b"\xa4" + head[1:] + cbor2.dumps("updates") + shared_bomb(depth)
