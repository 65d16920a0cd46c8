"""``read_pub_ack`` gives what ``json.loads`` gives for every publish ack (less the names no caller reads), and
reads the forms nats-server writes without it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rebaser_core.nats import pub_ack
from rebaser_core.nats.pub_ack import read_pub_ack

# Byte for byte what nats-server 2.15 answered (a work-queue stream with one message per subject).
SERVER_ACKS = [
    b'{"stream":"T","seq":1}',
    b'{"stream":"T","seq":2,"duplicate": true}',
    b'{"error":{"code":503,"err_code":10077,"description":"maximum messages per subject exceeded"},"stream":"T",'
    b'"seq":0}',
    b'{"stream":"KV_rebaser_change_sets","domain":"hub","seq":18446744073709551615}',
    b'{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"},"stream":"KV_x","seq":0}',
]


def _comparable(ack: Any) -> Any:
    """An ack without the fields ``read_pub_ack`` may leave out."""
    if not isinstance(ack, dict):
        return ack
    dropped = {"stream", "domain"} | ({"seq"} if "error" in ack else set())
    return {k: v for k, v in ack.items() if k not in dropped and not (k == "duplicate" and v is False)}


@pytest.mark.parametrize("data", SERVER_ACKS)
def test_the_server_forms_are_read_without_json_loads(data: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _comparable(json.loads(data))

    def refuse(_: object) -> None:
        raise AssertionError("json.loads was called")

    monkeypatch.setattr(pub_ack.json, "loads", refuse)
    assert read_pub_ack(data) == expected


_TEXT = st.text(max_size=12)
_NUMBER = st.integers(min_value=0, max_value=2**64 - 1)


@given(
    st.one_of(
        st.fixed_dictionaries(
            {"stream": _TEXT, "seq": _NUMBER},
            optional={"domain": _TEXT, "duplicate": st.booleans(), "other": st.integers()},
        ),
        st.fixed_dictionaries(
            {
                "error": st.fixed_dictionaries(
                    {"code": st.integers(0, 9999), "err_code": st.integers(0, 999_999), "description": _TEXT}
                )
            },
            optional={"stream": _TEXT, "seq": _NUMBER},
        ),
    ),
    st.sampled_from([{"separators": (",", ":")}, {}, {"separators": (",", ":"), "ensure_ascii": False}]),
)
def test_any_ack_reads_as_json_loads_reads_it(ack: dict[str, Any], options: dict[str, Any]) -> None:
    data = json.dumps(ack, **options).encode()
    assert _comparable(read_pub_ack(data)) == _comparable(json.loads(data))


@pytest.mark.parametrize("data", [b"", b"not json", b'{"stream":"T","seq":1', b"\xff\xfe"])
def test_what_is_not_json_raises_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        read_pub_ack(data)
