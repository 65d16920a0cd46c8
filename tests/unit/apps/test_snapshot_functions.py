"""The builtin functions a ``set_function`` update may name: normal inputs, and bad inputs raising."""

from __future__ import annotations

from typing import Any

import pytest

from rebaser_server.apps.snapshots.functions import BUILTIN_FUNCTIONS

F = BUILTIN_FUNCTIONS


def call(name: str, *args: Any) -> Any:
    return F[name](list(args))


def test_the_builtin_set_is_exactly_the_documented_one() -> None:
    assert set(F) == {
        "identity",
        "concat",
        "format",
        "sum",
        "min",
        "max",
        "get",
        "if",
        "coalesce",
        "length",
        "equals",
        "not",
    }


# -- identity -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, 0, 1.5, "x", True, [1, 2], {"a": [1]}])
def test_identity_returns_its_argument(value: Any) -> None:
    assert call("identity", value) == value


@pytest.mark.parametrize("args", [[], [1, 2], [None, None, None]])
def test_identity_takes_exactly_one_argument(args: list[Any]) -> None:
    with pytest.raises(TypeError):
        F["identity"](args)


# -- concat ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], ""),
        (["a"], "a"),
        (["a", "b", "c"], "abc"),
        (["a", None, "c"], "ac"),
        ([None, None], ""),
        (["port:", 8080], "port:8080"),
        ([1, 2, 3], "123"),
    ],
)
def test_concat(args: list[Any], expected: str) -> None:
    assert F["concat"](args) == expected


# -- format ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["plain"], "plain"),
        (["{}", "x"], "x"),
        (["{}:{}", "host", 80], "host:80"),
        (["<{}>", None], "<>"),
        (["{}{}{}", "a", "b", "c"], "abc"),
        (["a{}b", "{}"], "a{}b"),  # a value containing braces is not re-interpreted
        (
            [
                "{0} {name}",
            ],
            "{0} {name}",
        ),  # only bare {} is a placeholder: no indexing, no attribute access
    ],
)
def test_format_fills_placeholders_in_order(args: list[Any], expected: str) -> None:
    assert F["format"](args) == expected


@pytest.mark.parametrize("args", [["{}"], ["{} {}", "one"], ["none", "extra"], ["{}", "a", "b"]])
def test_format_placeholder_count_mismatch_raises_value_error(args: list[Any]) -> None:
    with pytest.raises(ValueError, match="placeholders"):
        F["format"](args)


@pytest.mark.parametrize("args", [[], [None], [1, "x"], [["{}"], "x"]])
def test_format_needs_a_template_string(args: list[Any]) -> None:
    with pytest.raises(TypeError):
        F["format"](args)


# -- sum / min / max ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [([], 0), ([1], 1), ([1, 2, 3], 6), ([1, None, 2], 3), ([None], 0), ([1, 2.5], 3.5), ([-1, 1], 0)],
)
def test_sum(args: list[Any], expected: float) -> None:
    assert F["sum"](args) == expected


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("min", [3, 1, 2], 1),
        ("max", [3, 1, 2], 3),
        ("min", [None, 5, None], 5),
        ("max", [2.5, 2], 2.5),
        ("min", [-1.5, 0], -1.5),
        ("min", [], None),
        ("max", [], None),
        ("min", [None, None], None),
        ("max", [None], None),
    ],
)
def test_min_max(name: str, args: list[Any], expected: Any) -> None:
    assert F[name](args) == expected


@pytest.mark.parametrize("name", ["sum", "min", "max"])
@pytest.mark.parametrize("bad", [True, False, "1", [1], {"a": 1}])
def test_numeric_functions_reject_non_numbers_including_booleans(name: str, bad: Any) -> None:
    with pytest.raises(TypeError, match="expected numbers"):
        F[name]([1, bad])
    with pytest.raises(TypeError):
        F[name]([bad])


# -- get ------------------------------------------------------------------------------------------------------

DOC = {
    "spec": {"ports": [{"port": 80}, {"port": 443}], "name": "web", "empty": None},
    "list": [[1, 2], [3]],
    "0": "zero",
}


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("spec.name", "web"),
        ("spec.ports.0", {"port": 80}),
        ("spec.ports.1.port", 443),
        ("spec.ports.-1.port", 443),  # negative list indexes count from the end
        ("list.1.0", 3),
        ("0", "zero"),  # a digit token on an object is an ordinary key
        ("spec", DOC["spec"]),
        ("", DOC),  # the empty key is the whole document
    ],
)
def test_get_follows_dotted_keys_through_objects_and_lists(key: str, expected: Any) -> None:
    assert call("get", DOC, key) == expected


@pytest.mark.parametrize(
    "key",
    [
        "missing",
        "spec.missing",
        "spec.missing.deeper",
        "spec.ports.2",  # index out of range
        "spec.ports.-3",
        "spec.ports.x",  # a non-index token on a list
        "spec.ports.-",
        "spec.name.0",  # cannot index into a string
        "spec.empty.x",  # cannot go through null
        "spec.ports.0.port.x",  # cannot go through a number
    ],
)
def test_get_missing_keys_give_none(key: str) -> None:
    assert call("get", DOC, key) is None


def test_get_on_a_null_or_scalar_document() -> None:
    assert call("get", None, "a") is None
    assert call("get", 5, "a") is None
    assert call("get", None, "") is None


@pytest.mark.parametrize("args", [[], [DOC], [DOC, 1], [DOC, None], [DOC, "a", "b"]])
def test_get_needs_a_document_and_a_key_string(args: list[Any]) -> None:
    with pytest.raises(TypeError):
        F["get"](args)


def test_get_non_ascii_digit_token_on_a_list_is_a_missing_key() -> None:
    assert call("get", [1, 2, 3], "\u00b2") is None


# -- if / coalesce / length / equals / not --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "expected"),
    [(True, "then"), (False, "else"), (None, "else"), (1, "then"), (0, "else"), ("x", "then"), ("", "else")],
)
def test_if_picks_by_truthiness(condition: Any, expected: str) -> None:
    assert call("if", condition, "then", "else") == expected


@pytest.mark.parametrize("args", [[], [True], [True, 1], [True, 1, 2, 3]])
def test_if_takes_exactly_three_arguments(args: list[Any]) -> None:
    with pytest.raises(TypeError):
        F["if"](args)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], None),
        ([None], None),
        ([None, 0, 1], 0),
        ([None, False], False),
        (["a", "b"], "a"),
        ([None, ""], ""),
    ],
)
def test_coalesce_returns_the_first_non_null(args: list[Any], expected: Any) -> None:
    result = F["coalesce"](args)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(("value", "expected"), [("", 0), ("abc", 3), ([], 0), ([1, 2], 2), ({"a": 1}, 1)])
def test_length(value: Any, expected: int) -> None:
    assert call("length", value) == expected


@pytest.mark.parametrize("args", [[], [None], [5], [True], [1.5], ["a", "b"]])
def test_length_rejects_other_inputs(args: list[Any]) -> None:
    with pytest.raises(TypeError):
        F["length"](args)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], True),
        ([1], True),
        ([1, 1], True),
        ([1, 1, 1], True),
        ([1, 2], False),
        ([1, 1, 2], False),
        (["a", "a"], True),
        ([None, None], True),
        ([None, 0], False),
        ([{"a": [1]}, {"a": [1]}], True),
        ([[1, 2], [2, 1]], False),
    ],
)
def test_equals(args: list[Any], expected: bool) -> None:
    assert F["equals"](args) is expected


@pytest.mark.parametrize("args", [[True, 1], [False, 0], [[True], [1]], [{"a": False}, {"a": 0}]])
def test_equals_does_not_treat_booleans_as_numbers(args: list[Any]) -> None:
    assert F["equals"](args) is False


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, False), (False, True), (None, True), (0, True), (1, False), ("", True), ("x", False), ([], True)],
)
def test_not(value: Any, expected: bool) -> None:
    assert call("not", value) is expected


@pytest.mark.parametrize("args", [[], [True, False]])
def test_not_takes_exactly_one_argument(args: list[Any]) -> None:
    with pytest.raises(TypeError):
        F["not"](args)


def test_functions_do_not_mutate_their_arguments() -> None:
    doc = {"a": [1, 2, {"b": 3}]}
    cases: list[tuple[str, list[Any]]] = [
        ("identity", [doc]),
        ("get", [doc, "a.2"]),
        ("length", [doc]),
        ("concat", ["x", 1]),
        ("coalesce", [None, doc]),
        ("equals", [doc, doc]),
    ]
    for name, args in cases:
        before = repr(args)
        F[name](args)
        assert repr(args) == before, name
