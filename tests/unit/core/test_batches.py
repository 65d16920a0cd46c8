"""A stored batch's parts and manifest (rebaser_core.batches): pure logic, no server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rebaser_core.batches import PART_BYTES, Manifest, is_address, split_parts
from rebaser_core.errors import DecodeError


@given(st.integers(min_value=1, max_value=5 * PART_BYTES))
def test_parts_rejoin_and_the_manifest_of_them_is_accepted(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    parts = split_parts(data)
    assert b"".join(parts) == data and all(0 < len(p) <= PART_BYTES for p in parts)
    manifest = Manifest(size=len(data), parts=len(parts))
    assert Manifest.decode(manifest.encode()) == manifest


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[]",
        b'{"size": 10}',
        b'{"size": 10, "parts": 2}',  # 10 bytes are one part
        b'{"size": 0, "parts": 0}',
        b'{"size": -1, "parts": 0}',
        b'{"size": 10.0, "parts": 1}',
        b'{"size": true, "parts": 1}',
        b'{"size": 10, "parts": 1, "pad": "' + b"x" * 300 + b'"}',  # over 256 bytes: never parsed
    ],
)
def test_a_manifest_that_does_not_add_up_is_refused(data: bytes) -> None:
    with pytest.raises(DecodeError):
        Manifest.decode(data)


def test_only_a_sha256_in_hex_is_an_address() -> None:
    assert is_address("0" * 64) and is_address("a" * 64)
    for junk in ("", "*", ">", "A" * 64, "a" * 63, "a" * 65, "a.b", "g" * 64, "a" * 63 + "*"):
        assert not is_address(junk), junk
