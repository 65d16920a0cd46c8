"""The snapshot app's JSON encoders (``rebaser_server.apps.snapshots.canonical``) write what ``json.dumps`` writes
with the same options, byte for byte, and fail as it fails; a failure leaves the reused encoder as good as new."""

from __future__ import annotations

import json
import math
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rebaser_server.apps.snapshots.canonical import canonical, canonical_str, compact

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
_OPTIONS: dict[str, Any] = {"separators": (",", ":"), "ensure_ascii": False, "allow_nan": False}


@given(_JSON)
def test_the_same_bytes_as_json_dumps(value: Any) -> None:
    assert canonical(value) == json.dumps(value, sort_keys=True, **_OPTIONS).encode()
    assert compact(value) == json.dumps(value, **_OPTIONS).encode()


@given(st.text())
def test_a_string_alone_is_encoded_as_the_encoder_encodes_it(text: str) -> None:
    assert canonical_str(text) == json.dumps(text, **_OPTIONS)
    assert canonical_str(text).encode() == canonical(text)


@pytest.mark.parametrize("bad", [math.nan, [1, math.inf], {"a": -math.inf}])
def test_nan_and_infinities_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError):
        canonical(bad)
    with pytest.raises(ValueError):
        json.dumps(bad, sort_keys=True, **_OPTIONS)
    assert canonical({"a": [1]}) == b'{"a":[1]}'


def test_a_circular_value_is_refused_and_the_encoder_still_works() -> None:
    looped: list[Any] = [1]
    looped.append(looped)
    for _ in range(3):  # each failure leaves the reused circular-reference table clean
        with pytest.raises(ValueError, match=r"[Cc]ircular"):
            canonical({"x": looped})
    shared = [1]
    assert canonical([shared, shared]) == b"[[1],[1]]"  # the same list twice is no cycle


def test_what_is_not_json_is_refused_as_json_dumps_refuses_it() -> None:
    with pytest.raises(TypeError):
        canonical({"a": object()})
    with pytest.raises(TypeError):
        canonical({1: "a", "b": 2})  # keys that do not sort together
    assert compact({"b": 1, "a": 2}) == b'{"b":1,"a":2}'


def test_each_thread_has_an_encoder_of_its_own() -> None:
    value = {"k": [list(range(50)) for _ in range(50)]}
    expected = json.dumps(value, sort_keys=True, **_OPTIONS).encode()
    results: list[bool] = []

    def work() -> None:
        results.extend(canonical(value) == expected for _ in range(200))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 800 and all(results)
