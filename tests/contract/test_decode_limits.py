"""Decoding untrusted bodies is bounded: no tag expands, no body nests or counts beyond the documented limits."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebaser_core import headers as h
from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    ENQUEUE_UPDATES_RESPONSE,
    GET_CHANGE_SET_REQUEST,
    ContentType,
)
from rebaser_core.api.codec import MAX_BODY_BYTES, MAX_DEPTH, MAX_ITEMS, decode_body
from rebaser_core.errors import DecodeError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from tests.support.hostile import request_bomb, shared_bomb

CBOR = ContentType.CBOR


def test_shared_reference_bomb_is_refused() -> None:
    bomb = shared_bomb(40)
    assert len(bomb) < 300
    with pytest.raises(DecodeError, match="tag 28"):
        decode_body(bomb, CBOR)


@pytest.mark.parametrize(
    "codec", [ENQUEUE_UPDATES_REQUEST, ENQUEUE_UPDATES_RESPONSE, GET_CHANGE_SET_REQUEST], ids=lambda c: c.name
)
def test_bomb_is_refused_by_every_message_decoder(codec: object) -> None:
    body = request_bomb(40, str(RequestId.new()), str(WorkspacePk.new()), str(ChangeSetId.new()))
    headers = {h.CONTENT_TYPE: CBOR.value, h.MESSAGE_TYPE: codec.name, h.MESSAGE_VERSION: "1"}  # type: ignore[attr-defined]
    with pytest.raises(DecodeError):
        codec.decode(headers, body)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "body",
    [
        bytes([0xD8, 0x1D, 0x00]),  # a shared reference alone
        bytes([0xD9, 0x01, 0x00, 0x80]),  # tag 256 (string reference namespace)
        bytes([0xC1, 0x00]),  # epoch datetime
        bytes([0xC2, 0x41, 0x01]),  # bignum
        bytes([0x43, 1, 2, 3]),  # byte string
        bytes([0xF7]),  # undefined
        bytes([0xF8, 0x20]),  # simple value 32
        bytes([0x9B]) + (2**63).to_bytes(8, "big"),  # an array that claims 2**63 items
        bytes([0x81]),  # truncated
        bytes([0xFF]),  # a lone break
        bytes([0x1C]),  # reserved additional information
    ],
)
def test_malformed_or_tagged_cbor_is_a_decode_error(body: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_body(body, CBOR)


@pytest.mark.parametrize("content_type", list(ContentType))
def test_nesting_beyond_the_limit_is_refused(content_type: ContentType) -> None:
    deep: object = 0
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    body = cbor2.dumps(deep) if content_type is CBOR else str(deep).encode()
    with pytest.raises(DecodeError, match="nested deeper"):
        decode_body(body, content_type)


def test_very_deep_cbor_does_not_exhaust_the_stack() -> None:
    with pytest.raises(DecodeError, match="nested deeper"):
        decode_body(b"\x81" * 1_000_000 + b"\x00", CBOR)


@pytest.mark.parametrize("content_type", list(ContentType))
def test_more_items_than_the_limit_are_refused(content_type: ContentType) -> None:
    many = [0] * (MAX_ITEMS + 1)
    body = cbor2.dumps(many) if content_type is CBOR else str(many).encode()
    with pytest.raises(DecodeError, match=f"more than {MAX_ITEMS}"):
        decode_body(body, content_type)


def test_body_over_the_size_limit_is_refused_before_decoding() -> None:
    with pytest.raises(DecodeError, match="exceeds the limit"):
        decode_body(cbor2.dumps("x" * MAX_BODY_BYTES), CBOR)


def test_indefinite_lengths_are_still_accepted() -> None:
    # [_ "a", {_ "k": (_ "x", "y")}]: indefinite array, map and chunked text string
    body = b"\x9f\x61a\xbf\x61k\x7f\x61x\x61y\xff\xff\xff"
    assert decode_body(body, CBOR) == ["a", {"k": "xy"}]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_the_scan_accepts_everything_the_encoder_writes(value: object) -> None:
    assert decode_body(cbor2.dumps(value), CBOR) == value


def test_change_set_record_with_shared_references_is_refused() -> None:
    from rebaser_server.record.model import ChangeSetRecord

    good = ChangeSetRecord(epoch=1, owner="o", state={"a": [1, 2]}).encode()
    assert ChangeSetRecord.decode(good).state == {"a": [1, 2]}
    head = cbor2.dumps({"v": 2, "epoch": 1, "owner": "o", "dvu_pending": False, "attempts": {}})
    bombed = b"\xa6" + head[1:] + cbor2.dumps("state") + shared_bomb(40) + b"\x80"
    with pytest.raises(DecodeError, match="tag 28"):
        ChangeSetRecord.decode(bombed)


def _outcome(body: bytes) -> object:
    try:
        return ("value", decode_body(body, CBOR))
    except DecodeError:
        return "refused"


def _mutations() -> st.SearchStrategy[bytes]:
    """Bodies near valid ones: an encoded value with a few bytes overwritten, or raw bytes."""
    flips = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4)

    def mutate(encoded: bytes, changes: list[tuple[int, int]]) -> bytes:
        data = bytearray(encoded)
        for at, byte in changes:
            if data:
                data[at % len(data)] = byte
        return bytes(data)

    return st.builds(mutate, json_values.map(cbor2.dumps), flips) | st.binary(max_size=64)


@settings(max_examples=500, deadline=None)
@given(_mutations())
def test_the_cheap_check_decides_as_the_full_scan_does(body: bytes) -> None:
    # check_plain skips the walk when the bytes alone prove it safe: whatever it lets through must end as the full
    # scan would have it end (refused, or the same value).
    from unittest import mock

    from rebaser_core.api import cbor_scan

    cheap = _outcome(body)
    with mock.patch(
        "rebaser_core.api.codec.check_plain", lambda data, limits: cbor_scan.scan_item(data, 0, limits)
    ):
        assert _outcome(body) == cheap


def test_the_cheap_check_walks_nothing_for_a_small_request_and_falls_back_otherwise() -> None:
    from unittest import mock

    from rebaser_core.api import cbor_scan

    small = cbor2.dumps({"id": str(RequestId.new()), "updates": [{"op": "set", "path": "/n", "value": 1}]})
    lookalike = cbor2.dumps({"text": "\u00c0 starts with the byte of a tag head once encoded"})
    shallow_but_wide = cbor2.dumps([{} for _ in range(MAX_DEPTH + 1)])
    with mock.patch.object(cbor_scan, "scan_item", wraps=cbor_scan.scan_item) as scan:
        decode_body(small, CBOR)
        assert scan.call_count == 0
        assert decode_body(lookalike, CBOR) == {
            "text": "\u00c0 starts with the byte of a tag head once encoded"
        }
        assert decode_body(shallow_but_wide, CBOR) == [{} for _ in range(MAX_DEPTH + 1)]
        assert scan.call_count == 2
