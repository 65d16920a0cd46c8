"""The JSON-data-model check of decoded bodies (``codec._check``) decides exactly as a plainer version of it.

The check runs on every request and reply, so it is written for speed (exact type dispatch, scalars without a
call of their own, no text and integer checks for CBOR that cbor2 already guarantees). The plain version here is
the specification.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rebaser_core.api import codec
from rebaser_core.api.codec import MAX_DEPTH, MAX_ITEMS

_MAX_INT = 2**64


def _reference(value: Any, counter: list[int], depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise ValueError("deep")
    counter[0] += 1
    if counter[0] > MAX_ITEMS:
        raise ValueError("many")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not -_MAX_INT <= value < _MAX_INT:
            raise ValueError("int")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("float")
    elif isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, list):
        for item in value:
            _reference(item, counter, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError("key")
            _reference(key, counter, depth + 1)
            _reference(item, counter, depth + 1)
    else:
        raise ValueError("type")


def _accepted_by_reference(value: Any) -> bool:
    try:
        _reference(value, [0])
    except ValueError:
        return False
    return True


def _accepted(value: Any) -> bool:
    try:
        codec._check(value, codec._Counter())
    except ValueError:
        return False
    return True


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**65), max_value=2**65)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(["\ud800", "\udfff"]), max_size=4)
    | st.binary(max_size=3)
)
_keys = st.text(max_size=3) | st.integers(0, 3) | st.sampled_from(["\ud800", (1, 2)])
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=600, deadline=None)
@given(_values)
def test_decides_as_the_plain_version(value: Any) -> None:
    assert _accepted(value) == _accepted_by_reference(value)


def _nested(depth: int, innermost: Any) -> Any:
    value = innermost
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def test_the_depth_limit_is_where_it_was() -> None:
    for depth in range(MAX_DEPTH - 2, MAX_DEPTH + 3):
        for innermost in (1, [], {}, "s", [1]):
            value = _nested(depth, innermost)
            assert _accepted(value) == _accepted_by_reference(value), (depth, innermost)


def test_the_item_limit_is_where_it_was() -> None:
    for size in (MAX_ITEMS - 2, MAX_ITEMS - 1, MAX_ITEMS, MAX_ITEMS + 1):
        for value in ([0] * size, {str(i): 0 for i in range(size // 2)}, [[0] * (size - 2)]):
            assert _accepted(value) == _accepted_by_reference(value), len(value)


def _cbor_can_carry(value: Any) -> bool:
    """What cbor2 can decode from untagged CBOR: valid UTF-8 text, integers within 64 bits (and anything else)."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "ignore") == value
    if isinstance(value, int) and not isinstance(value, bool):
        return -_MAX_INT <= value < _MAX_INT
    if isinstance(value, list):
        return all(_cbor_can_carry(v) for v in value)
    if isinstance(value, dict):
        return all(_cbor_can_carry(k) and _cbor_can_carry(v) for k, v in value.items())
    return True


@settings(max_examples=600, deadline=None)
@given(_values)
def test_for_cbor_the_skipped_checks_are_the_ones_cbor2_makes(value: Any) -> None:
    if not _cbor_can_carry(value):
        return
    try:
        codec._check(value, codec._Counter(), texts=False)
        cbor_accepted = True
    except ValueError:
        cbor_accepted = False
    assert cbor_accepted == _accepted_by_reference(value)
