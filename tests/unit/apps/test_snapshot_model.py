"""Snapshots, the rebase of an update batch, applying one change set onto another, and the dependent values update.

Pure model tests: no NATS.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rebaser_core.api import Remove, SetFunction, SetLiteral, Update
from rebaser_server.apps.snapshots.canonical import canonical
from rebaser_server.apps.snapshots.dvu import dependent_values_update, settled_without_update
from rebaser_server.apps.snapshots.functions import BUILTIN_FUNCTIONS
from rebaser_server.apps.snapshots.model import (
    Attribute,
    Function,
    Snapshot,
    apply_changes,
    changes_since,
    rebase,
)

EMPTY = Snapshot()
F: Mapping[str, Function] = BUILTIN_FUNCTIONS


def lit(path: str, value: Any, expected: str | None = None) -> SetLiteral:
    return SetLiteral(path=path, value=value, expected_version=expected)


def fn(path: str, function: str, *args: str, expected: str | None = None) -> SetFunction:
    return SetFunction(path=path, function=function, args=list(args), expected_version=expected)


def rm(path: str, expected: str | None = None) -> Remove:
    return Remove(path=path, expected_version=expected)


def ok(snapshot: Snapshot, *updates: Update) -> Snapshot:
    rebased = rebase(snapshot, list(updates))
    assert rebased.ok, rebased.conflicts
    assert rebased.performed == len(updates)
    return rebased.snapshot


def dvu(snapshot: Snapshot, functions: Mapping[str, Function] = F) -> tuple[Snapshot, list[str]]:
    updated, order = dependent_values_update(snapshot, functions)
    assert_valid_order(updated, order)
    assert updated.roots == frozenset()
    return updated, order


def settle(snapshot: Snapshot, functions: Mapping[str, Function] = F) -> Snapshot:
    return dvu(snapshot, functions)[0]


def assert_valid_order(snapshot: Snapshot, order: Sequence[str]) -> None:
    """Each attribute computed once, and after every argument computed in the same run."""
    assert len(order) == len(set(order)), f"computed more than once: {order}"
    position = {p: i for i, p in enumerate(order)}
    for path in order:
        attribute = snapshot.attributes[path]
        assert attribute.is_function
        for arg in attribute.args:
            if arg in position:
                assert position[arg] < position[path], f"{path} computed before its input {arg}: {order}"


# -- rebase: literals ---------------------------------------------------------------------------------------------


def test_set_overwrite_and_remove_literals() -> None:
    s = ok(EMPTY, lit("/a", 1), lit("/b", {"x": [1, 2]}), lit("/c", None))
    assert s.values() == {"/a": 1, "/b": {"x": [1, 2]}, "/c": None}
    assert all(not a.is_function and a.error is None and not a.stale for a in s.attributes.values())
    s2 = ok(s, lit("/a", "one"), rm("/b"))
    assert s2.values() == {"/a": "one", "/c": None}
    assert s.values() == {"/a": 1, "/b": {"x": [1, 2]}, "/c": None}, "the input snapshot is not modified"


def test_later_updates_in_a_batch_win() -> None:
    s = ok(EMPTY, lit("/a", 1), lit("/a", 2), lit("/b", 1), rm("/b"), rm("/c"), lit("/c", 3))
    assert s.values() == {"/a": 2, "/c": 3}


def test_removing_an_absent_path_is_not_an_error() -> None:
    s = ok(EMPTY, rm("/nothing"))
    assert s.attributes == {}
    assert s.roots == {"/nothing"}


def test_a_literal_replaces_a_function_and_a_function_replaces_a_literal() -> None:
    s = settle(ok(EMPTY, lit("/a", 2), fn("/f", "identity", "/a")))
    s = ok(s, lit("/f", "plain"), fn("/a", "identity", "/f"))
    assert s.attributes["/f"] == Attribute(value="plain")
    assert s.attributes["/a"].function == "identity"
    assert s.attributes["/a"].stale
    assert s.attributes["/a"].value == 2, "a new function keeps the previous value until recomputed"
    assert settle(s).values() == {"/a": "plain", "/f": "plain"}


def test_roots_contain_every_path_touched() -> None:
    s = ok(EMPTY, lit("/a", 1), fn("/b", "identity", "/a"), rm("/gone"))
    assert s.roots == {"/a", "/b", "/gone"}
    s = ok(s, lit("/c", 1))
    assert s.roots == {"/a", "/b", "/gone", "/c"}, "roots accumulate until the dependent values update"
    assert settle(s).roots == frozenset()


def test_set_function_is_stale_until_computed() -> None:
    s = ok(EMPTY, fn("/f", "sum", "/a", "/b"))
    attribute = s.attributes["/f"]
    assert (attribute.function, attribute.args, attribute.stale, attribute.value) == (
        "sum",
        ("/a", "/b"),
        True,
        None,
    )


# -- rebase: expected versions and atomicity ------------------------------------------------------------------------


def test_matching_expected_versions_apply() -> None:
    s = ok(EMPTY, lit("/a", 1), lit("/b", 2))
    s2 = ok(s, lit("/a", 10, expected=s.version("/a")), rm("/b", expected=s.version("/b")))
    assert s2.values() == {"/a": 10}


def test_one_conflict_refuses_the_whole_batch() -> None:
    s = ok(EMPTY, lit("/a", 1), lit("/b", 2), lit("/c", 3))
    stale = s.version("/b")
    s = ok(s, lit("/b", 20))
    batch: list[Update] = [
        lit("/a", 100, expected=s.version("/a")),  # matches
        lit("/b", 200, expected=stale),  # conflicts
        lit("/c", 300),  # no expectation
        fn("/f", "identity", "/a"),
        rm("/a"),
    ]
    rebased = rebase(s, batch)
    assert not rebased.ok
    assert rebased.snapshot is s
    assert rebased.snapshot.address == s.address
    assert rebased.performed == 0
    assert [(c.path, c.expected_version, c.actual_version) for c in rebased.conflicts] == [
        ("/b", stale, s.version("/b"))
    ]
    assert s.values() == {"/a": 1, "/b": 20, "/c": 3}


def test_every_conflicting_path_is_reported_and_only_those() -> None:
    s = ok(EMPTY, lit("/a", 1), lit("/b", 2), lit("/c", 3))
    rebased = rebase(
        s,
        [
            lit("/a", 0, expected="wrong-a"),
            lit("/b", 0, expected=s.version("/b")),
            rm("/c", expected="wrong-c"),
            lit("/d", 0),
        ],
    )
    assert {(c.path, c.expected_version, c.actual_version) for c in rebased.conflicts} == {
        ("/a", "wrong-a", s.version("/a")),
        ("/c", "wrong-c", s.version("/c")),
    }
    assert rebased.snapshot is s


def test_conflict_on_an_absent_attribute() -> None:
    rebased = rebase(EMPTY, [lit("/x", 1, expected="x")])
    assert not rebased.ok
    [conflict] = rebased.conflicts
    assert (conflict.path, conflict.expected_version, conflict.actual_version) == ("/x", "x", None)
    assert rebased.snapshot is EMPTY


def test_a_removed_attribute_conflicts_with_its_old_version() -> None:
    s = ok(EMPTY, lit("/a", 1))
    old = s.version("/a")
    s = ok(s, rm("/a"))
    [conflict] = rebase(s, [lit("/a", 2, expected=old)]).conflicts
    assert (conflict.expected_version, conflict.actual_version) == (old, None)


def test_expected_version_none_means_no_expectation() -> None:
    s = ok(EMPTY, lit("/a", 1))
    s = ok(s, lit("/a", 2, expected=None), lit("/new", 1, expected=None), rm("/missing", expected=None))
    assert s.values() == {"/a": 2, "/new": 1}


# -- versions and addresses -----------------------------------------------------------------------------------------


def test_versions_change_with_the_value_and_not_when_the_same_value_is_set_again() -> None:
    s1 = ok(EMPTY, lit("/a", {"x": 1, "y": [1, 2]}))
    s2 = ok(s1, lit("/a", {"y": [1, 2], "x": 1}))
    assert s2.version("/a") == s1.version("/a")
    s3 = ok(s2, lit("/a", {"x": 1, "y": [2, 1]}))
    assert s3.version("/a") != s1.version("/a")
    versions = {
        ok(EMPTY, lit("/a", v)).version("/a") for v in [1, "1", True, None, [1], {"1": 1}, 1.5, 0, False]
    }
    assert len(versions) == 9
    assert EMPTY.version("/a") is None


def test_version_changes_when_a_function_is_computed_or_redefined() -> None:
    s = ok(EMPTY, lit("/a", 1), fn("/f", "identity", "/a"))
    stale = s.version("/f")
    computed = settle(s)
    assert computed.version("/f") != stale
    assert computed.version("/a") == s.version("/a")
    redefined = ok(computed, fn("/f", "identity", "/b"))
    assert redefined.version("/f") not in {stale, computed.version("/f")}


def test_the_address_is_deterministic_and_independent_of_insertion_order() -> None:
    updates: list[Update] = [
        lit("/a", 1),
        lit("/b", {"k": "v", "j": [None]}),
        fn("/c", "sum", "/a", "/b"),
        rm("/z"),
    ]
    one = ok(EMPTY, *updates)
    other = ok(EMPTY, *reversed(updates))
    assert one.address == other.address
    assert one.encode() == other.encode()
    shuffled = Snapshot(dict(reversed(list(one.attributes.items()))), frozenset(reversed(sorted(one.roots))))
    assert shuffled.address == one.address
    assert len(one.address) == 64
    assert EMPTY.address == Snapshot().address


def test_the_address_changes_when_the_content_changes() -> None:
    s = ok(EMPTY, lit("/a", 1))
    addresses = {
        EMPTY.address,
        s.address,
        ok(s, lit("/a", 2)).address,
        ok(s, lit("/b", 1)).address,
        ok(s, fn("/a", "identity")).address,
        Snapshot(s.attributes).address,  # same attributes, no roots
        settle(ok(s, fn("/f", "identity", "/a"))).address,
    }
    assert len(addresses) == 7


def test_an_attribute_keeps_its_text_and_stays_a_plain_value() -> None:
    """The kept JSON text (what encoding and versions are made from) is the canonical form, never part of the value,
    and never carried over to a changed copy."""
    attribute = Attribute(value={"b": [1, "é"], "a": None}, function="sum", args=("/x",), stale=True)
    fresh = Attribute(value={"b": [1, "é"], "a": None}, function="sum", args=("/x",), stale=True)
    text = attribute.json_text()
    assert text == canonical(attribute.to_json()).decode()
    assert attribute.json_text() is text  # kept
    assert attribute == fresh  # equal to one that has not made it yet
    one = Attribute(value=1)
    one.json_text()
    assert hash(one) == hash(Attribute(value=1))
    assert attribute.version == hashlib.sha256(canonical(attribute.to_json())).hexdigest()[:16]
    changed = dataclasses.replace(attribute, stale=False)
    assert changed.json_text() == canonical(changed.to_json()).decode() != text
    assert "_json" not in repr(attribute)


@given(st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), max_size=6))
def test_a_snapshot_encodes_as_the_canonical_form_of_its_json_however_often(values: dict[str, Any]) -> None:
    snapshot = Snapshot({path: Attribute(value=value) for path, value in values.items()}, frozenset(values))
    expected = canonical(snapshot.to_json())
    assert snapshot.encode() == expected
    assert snapshot.encode() == expected  # from the kept texts
    assert Snapshot.decode(expected).encode() == expected


def test_encode_decode_round_trip_preserves_the_address() -> None:
    s = ok(
        EMPTY,
        lit("/a", 1),
        lit("/doc", {"b": [1, 2.5, None, True, "x"], "a": {}}),
        lit("/unicode", "h\u00e9llo \u2603"),
        fn("/sum", "sum", "/a", "/a"),
        fn("/bad", "nope", "/a"),
        fn("/cyc", "identity", "/cyc"),
    )
    for snapshot in (s, settle(s), ok(settle(s), fn("/late", "identity", "/a"))):
        decoded = Snapshot.decode(snapshot.encode())
        assert decoded == snapshot
        assert decoded.address == snapshot.address
        assert decoded.roots == snapshot.roots
        assert decoded.errors() == snapshot.errors()
    assert Snapshot.decode(EMPTY.encode()) == EMPTY


def test_rebasing_the_same_literal_batch_twice_equals_once() -> None:
    base = settle(ok(EMPTY, lit("/a", 1), lit("/b", 2), fn("/f", "sum", "/a", "/b")))
    batch: list[Update] = [lit("/a", 5), lit("/c", [1, 2]), rm("/b"), lit("/a", 6)]
    once = ok(base, *batch)
    twice = ok(once, *batch)
    assert twice == once
    assert twice.address == once.address
    assert settle(twice).address == settle(once).address


# -- dependent values update ------------------------------------------------------------------------------------------


def test_chain_is_computed_in_dependency_order_each_once() -> None:
    s = ok(
        EMPTY,
        fn("/d", "concat", "/c"),
        fn("/c", "sum", "/b", "/k"),
        fn("/b", "identity", "/a"),
        lit("/a", 1),
        lit("/k", 10),
    )
    s, order = dvu(s)
    assert order == ["/b", "/c", "/d"]
    assert s.values() == {"/a": 1, "/k": 10, "/b": 1, "/c": 11, "/d": "11"}
    assert not any(a.stale for a in s.attributes.values())
    s, order = dvu(ok(s, lit("/a", 5)))
    assert order == ["/b", "/c", "/d"]
    assert s.values()["/d"] == "15"
    s, order = dvu(ok(s, lit("/k", 0)))
    assert order == ["/c", "/d"], "only what is downstream of the root"
    assert s.values()["/d"] == "5"


def test_diamond_computes_the_join_once_after_both_branches() -> None:
    s = settle(
        ok(
            EMPTY,
            lit("/a", 2),
            fn("/b", "identity", "/a"),
            fn("/c", "sum", "/a", "/a"),
            fn("/d", "sum", "/b", "/c"),
            fn("/e", "format", "/t", "/d"),
            lit("/t", "d={}"),
        )
    )
    assert s.values()["/e"] == "d=6"
    s, order = dvu(ok(s, lit("/a", 3)))
    assert sorted(order) == ["/b", "/c", "/d", "/e"]
    assert order.index("/d") > max(order.index("/b"), order.index("/c"))
    assert order[-1] == "/e"
    assert s.values()["/d"] == 9
    assert s.values()["/e"] == "d=9"


def test_wide_fan_in_and_fan_out_each_computed_once() -> None:
    leaves = [f"/l{i}" for i in range(20)]
    s = ok(
        EMPTY,
        lit("/a", 1),
        *[fn(p, "identity", "/a") for p in leaves],
        fn("/total", "sum", *leaves),
        *[fn(f"/m{i}", "identity", "/total") for i in range(5)],
    )
    s, order = dvu(s)
    assert len(order) == 26
    assert s.values()["/total"] == 20
    s, order = dvu(ok(s, lit("/a", 2)))
    assert len(order) == 26
    assert all(s.values()[f"/m{i}"] == 40 for i in range(5))


def test_untouched_functions_outside_the_downstream_set_are_not_recomputed() -> None:
    s = settle(
        ok(
            EMPTY,
            lit("/a", 1),
            lit("/z", "z"),
            fn("/b", "identity", "/a"),
            fn("/y", "identity", "/z"),
            fn("/y2", "concat", "/y", "/y"),
            fn("/upstream", "identity", "/z"),
        )
    )
    before = s.attributes
    s, order = dvu(ok(s, lit("/a", 2)))
    assert order == ["/b"]
    for path in ("/y", "/y2", "/upstream", "/z"):
        assert s.attributes[path] is before[path]


def test_a_function_root_with_no_dependents_is_computed() -> None:
    s, order = dvu(ok(EMPTY, lit("/a", 1), fn("/f", "identity", "/a")))
    assert order == ["/f"]
    s, order = dvu(ok(s, fn("/g", "sum", "/a", "/f")))
    assert order == ["/g"]
    assert s.values()["/g"] == 2


def test_roots_are_cleared_and_a_second_update_computes_nothing() -> None:
    s, order = dvu(ok(EMPTY, lit("/a", 1), fn("/b", "identity", "/a")))
    assert order == ["/b"]
    assert s.roots == frozenset()
    again, order = dvu(s)
    assert order == []
    assert again == s
    assert again.address == s.address


def test_literal_only_roots_compute_nothing_but_are_cleared() -> None:
    s, order = dvu(ok(EMPTY, lit("/a", 1), rm("/b")))
    assert order == []
    assert s.values() == {"/a": 1}


def test_removing_an_input_recomputes_dependents_from_none() -> None:
    s = settle(
        ok(
            EMPTY,
            lit("/a", 4),
            lit("/b", 1),
            fn("/id", "identity", "/a"),
            fn("/total", "sum", "/a", "/b"),
            fn("/first", "coalesce", "/a", "/b"),
            fn("/next", "identity", "/id"),
        )
    )
    assert s.values() == {"/a": 4, "/b": 1, "/id": 4, "/total": 5, "/first": 4, "/next": 4}
    s, order = dvu(ok(s, rm("/a")))
    assert set(order) == {"/id", "/total", "/first", "/next"}
    assert s.values() == {"/b": 1, "/id": None, "/total": 1, "/first": 1, "/next": None}
    assert s.errors() == {}


def test_removing_a_function_recomputes_its_dependents() -> None:
    s = settle(ok(EMPTY, lit("/a", 1), fn("/b", "identity", "/a"), fn("/c", "identity", "/b")))
    s, order = dvu(ok(s, rm("/b")))
    assert order == ["/c"]
    assert s.values() == {"/a": 1, "/c": None}


def test_a_missing_input_reads_as_none() -> None:
    s = settle(ok(EMPTY, fn("/f", "coalesce", "/nothing", "/also-nothing"), fn("/n", "sum", "/nothing")))
    assert s.values() == {"/f": None, "/n": 0}
    assert s.errors() == {}


def test_a_function_whose_input_has_an_error_gets_an_error_naming_that_input() -> None:
    s = settle(
        ok(
            EMPTY,
            lit("/text", "abc"),
            fn("/broken", "sum", "/text"),
            fn("/dependent", "identity", "/broken"),
            fn("/transitive", "concat", "/dependent"),
            fn("/fine", "length", "/text"),
        )
    )
    errors = s.errors()
    assert set(errors) == {"/broken", "/dependent", "/transitive"}
    assert "TypeError" in errors["/broken"]
    assert "/broken" in errors["/dependent"]
    assert "/dependent" in errors["/transitive"]
    assert s.values()["/dependent"] is None
    assert s.values()["/fine"] == 3
    # fixing the input clears the errors downstream
    s = settle(ok(s, lit("/text", 7)))
    assert set(s.errors()) == {"/fine"}, "now /fine is the one failing: length of a number"
    assert s.values()["/transitive"] == "7"


@pytest.mark.timeout(5)
def test_self_cycle_is_an_error_and_terminates() -> None:
    s, order = dvu(ok(EMPTY, lit("/x", 1), fn("/a", "sum", "/a", "/x")))
    assert order == []
    assert s.values()["/a"] is None
    assert "cycle" in s.errors()["/a"]
    assert not s.attributes["/a"].stale


@pytest.mark.timeout(5)
def test_three_cycle_and_downstream_nodes_are_errors_and_the_rest_is_computed() -> None:
    s = ok(
        EMPTY,
        lit("/x", 1),
        fn("/a", "identity", "/c"),
        fn("/b", "identity", "/a"),
        fn("/c", "sum", "/b", "/x"),
        fn("/down", "identity", "/b"),
        fn("/further", "concat", "/down"),
        fn("/healthy", "identity", "/x"),
    )
    s, order = dvu(s)
    assert order == ["/healthy"]
    errors = s.errors()
    assert set(errors) == {"/a", "/b", "/c", "/down", "/further"}
    for path in ("/a", "/b", "/c"):
        assert "cycle" in errors[path]
        assert s.values()[path] is None
    assert s.values()["/down"] is None
    assert s.values()["/healthy"] == 1
    # a later update touching the cycle terminates too, and breaking the cycle recovers everything
    s, _ = dvu(ok(s, lit("/x", 2)))
    assert set(s.errors()) == {"/a", "/b", "/c", "/down", "/further"}
    s, order = dvu(ok(s, lit("/a", 5)))
    assert s.errors() == {}
    assert s.values() == {"/x": 2, "/a": 5, "/b": 5, "/c": 7, "/down": 5, "/further": "5", "/healthy": 2}


@pytest.mark.timeout(5)
def test_a_cycle_formed_across_batches_is_detected() -> None:
    s = settle(ok(EMPTY, fn("/a", "identity", "/b")))
    assert s.errors() == {}
    s = settle(ok(s, fn("/b", "identity", "/a")))
    assert set(s.errors()) == {"/a", "/b"}


@pytest.mark.timeout(5)
def test_a_function_reading_an_old_cycle_outside_the_update_gets_an_input_error() -> None:
    s = settle(ok(EMPTY, fn("/a", "identity", "/b"), fn("/b", "identity", "/a")))
    s, order = dvu(ok(s, fn("/reader", "identity", "/a")))
    assert order == ["/reader"]
    assert "/a" in s.errors()["/reader"]


def test_an_unknown_function_is_an_error_value() -> None:
    s, order = dvu(ok(EMPTY, lit("/a", 1), fn("/f", "no_such_function", "/a"), fn("/g", "identity", "/f")))
    assert order == ["/f", "/g"]
    assert "no_such_function" in s.errors()["/f"]
    assert s.values()["/f"] is None
    assert "/f" in s.errors()["/g"]


def test_a_raising_function_is_an_error_value() -> None:
    def boom(args: list[Any]) -> Any:
        raise RuntimeError("kaboom")

    functions = {**F, "boom": boom, "div": lambda args: args[0] / args[1]}
    s, _ = dvu(
        ok(EMPTY, lit("/a", 1), lit("/zero", 0), fn("/f", "boom", "/a"), fn("/g", "div", "/a", "/zero")),
        functions,
    )
    assert "RuntimeError" in s.errors()["/f"]
    assert "kaboom" in s.errors()["/f"]
    assert "ZeroDivisionError" in s.errors()["/g"]
    assert s.values()["/f"] is None


@pytest.mark.parametrize(
    "bad",
    [
        float("nan"),
        float("inf"),
        -math.inf,
        {1, 2},
        object(),
        b"bytes",
        [1, float("nan")],
        {"k": {1}},
        {(1, 2): 3},
    ],
    ids=["nan", "inf", "-inf", "set", "object", "bytes", "nested-nan", "nested-set", "tuple-key"],
)
def test_a_function_returning_a_non_json_value_is_an_error_value(bad: Any) -> None:
    s, order = dvu(ok(EMPTY, fn("/f", "bad"), fn("/g", "identity", "/f")), {**F, "bad": lambda args: bad})
    assert order == ["/f", "/g"]
    assert s.values()["/f"] is None
    assert "bad failed" in s.errors()["/f"]
    assert "/f" in s.errors()["/g"]
    Snapshot.decode(s.encode())  # whatever is stored is valid JSON


@pytest.mark.parametrize("returned", [(1, 2), {1: "x"}], ids=["tuple", "int-key"])
def test_computed_values_equal_their_stored_json_form(returned: Any) -> None:
    s, _ = dvu(ok(EMPTY, fn("/f", "custom")), {**F, "custom": lambda args: returned})
    assert Snapshot.decode(s.encode()) == s


def test_function_arguments_are_passed_in_order_with_duplicates() -> None:
    seen: list[list[Any]] = []

    def record(args: list[Any]) -> Any:
        seen.append(list(args))
        return len(args)

    s, _ = dvu(
        ok(EMPTY, lit("/a", "A"), lit("/b", "B"), fn("/f", "rec", "/b", "/a", "/b", "/missing")),
        {"rec": record},
    )
    assert seen == [["B", "A", "B", None]]
    assert s.values()["/f"] == 4


def test_dvu_does_not_modify_its_input() -> None:
    s = ok(EMPTY, lit("/a", 1), fn("/b", "identity", "/a"))
    encoded = s.encode()
    dvu(s)
    assert s.encode() == encoded


# -- applying one change set onto another ------------------------------------------------------------------------------


def _a() -> Snapshot:
    return settle(
        ok(
            EMPTY,
            lit("/a", 1),
            lit("/b", 2),
            lit("/z", "zed"),
            lit("/r", "r"),
            fn("/f", "sum", "/a", "/b"),
            fn("/g", "concat", "/z", "/z"),
        )
    )


def _b_changes(base: Snapshot) -> Snapshot:
    """B's own work: change /a, add /n and the function /h, remove /r, redefine /g."""
    return settle(
        ok(
            base,
            lit("/a", 10),
            lit("/n", 5),
            fn("/h", "sum", "/a", "/n"),
            rm("/r"),
            fn("/g", "identity", "/z"),
        )
    )


def test_changes_since_lists_exactly_the_changed_added_and_removed_paths() -> None:
    base = _a()
    b = _b_changes(base)
    assert b.values()["/f"] == 12, "/f's computed value changed in B..."
    changes = changes_since(base, b)
    assert [c.path for c in changes] == ["/a", "/g", "/h", "/n", "/r"], "...but only definitions are changes"
    by_path = {c.path: c for c in changes}
    for path in ("/a", "/g", "/r"):
        assert by_path[path].base_version == base.version(path)
    for path in ("/h", "/n"):
        assert by_path[path].base_version is None
    assert by_path["/r"].attribute is None
    assert by_path["/a"].attribute == Attribute(value=10)
    assert changes_since(base, base) == []
    assert changes_since(b, b) == []


def test_setting_the_same_value_or_definition_again_is_not_a_change() -> None:
    base = _a()
    b = settle(ok(base, lit("/a", 1), fn("/f", "sum", "/a", "/b"), lit("/a", 1)))
    assert changes_since(base, b) == []
    b2 = ok(base, lit("/a", 2), lit("/a", 1), rm("/nothing"))
    assert changes_since(base, b2) == []


def test_applying_onto_an_unchanged_target_gives_the_source() -> None:
    a = base = _a()
    b = _b_changes(base)
    applied = apply_changes(a, changes_since(base, b))
    assert applied.ok
    assert applied.performed == 5
    assert applied.snapshot.roots == {"/a", "/g", "/h", "/n", "/r"}
    result, order = dvu(applied.snapshot)
    assert set(order) == {"/f", "/g", "/h"}
    assert result.values() == b.values()
    assert result == b
    assert result.address == b.address


def test_a_path_the_target_changed_since_the_fork_is_a_conflict_and_nothing_is_applied() -> None:
    base = _a()
    b = _b_changes(base)
    a = settle(ok(base, lit("/a", 99), lit("/unrelated", 1)))
    rebased = apply_changes(a, changes_since(base, b))
    assert not rebased.ok
    assert rebased.snapshot is a
    assert rebased.performed == 0
    assert [(c.path, c.expected_version, c.actual_version) for c in rebased.conflicts] == [
        ("/a", base.version("/a"), a.version("/a"))
    ]


@pytest.mark.parametrize(
    "target_update",
    [lit("/n", 5), lit("/h", 0), rm("/r"), fn("/g", "identity", "/z"), rm("/a")],
    ids=["both-added-same", "both-added-different", "both-removed", "same-redefinition", "removed-changed"],
)
def test_any_concurrent_change_to_the_same_path_conflicts(target_update: Update) -> None:
    base = _a()
    b = _b_changes(base)
    a = settle(ok(base, target_update))
    rebased = apply_changes(a, changes_since(base, b))
    assert [c.path for c in rebased.conflicts] == [target_update.path]
    assert rebased.snapshot is a


def test_changes_to_different_paths_both_survive() -> None:
    base = _a()
    b = _b_changes(base)
    a = settle(ok(base, lit("/only-a", True), rm("/b"), fn("/k", "identity", "/z")))
    applied = apply_changes(a, changes_since(base, b))
    assert applied.ok, applied.conflicts
    result = settle(applied.snapshot)
    assert result.values() == {
        "/a": 10,  # from B
        "/n": 5,  # from B
        "/h": 15,  # B's function, recomputed on A
        "/g": "zed",  # B's redefinition
        "/z": "zed",
        "/only-a": True,  # from A
        "/k": "zed",  # from A
        "/f": 10,  # A's function over A's removal of /b and B's change of /a
    }


def test_function_definitions_travel_and_are_marked_for_recompute() -> None:
    base = _a()
    b = settle(
        ok(base, fn("/h", "sum", "/a", "/b"), fn("/u", "unknown_fn", "/a"), fn("/f", "max", "/a", "/b"))
    )
    assert "/u" in b.errors()
    applied = apply_changes(base, changes_since(base, b)).snapshot
    for path in ("/h", "/u", "/f"):
        attribute = applied.attributes[path]
        assert (attribute.function, attribute.args) == (b.attributes[path].function, b.attributes[path].args)
        assert attribute.stale
        assert attribute.error is None, "errors do not travel"
        assert path in applied.roots
    result = settle(applied)
    assert result.values() == b.values()
    assert result.errors() == b.errors()


def test_applying_a_function_carries_the_definition_not_the_computed_value() -> None:
    base = _a()
    b = settle(ok(base, fn("/f", "max", "/a", "/b"), lit("/b", 50)))
    assert b.values()["/f"] == 50
    a = settle(ok(base, lit("/unrelated", 0)))
    applied = apply_changes(a, [c for c in changes_since(base, b) if c.path == "/f"]).snapshot
    via_rebase = ok(a, fn("/f", "max", "/a", "/b"))
    assert applied.attributes["/f"] == via_rebase.attributes["/f"]


def test_a_recomputed_but_unchanged_function_is_not_a_conflict() -> None:
    base = _a()
    b = settle(ok(base, fn("/f", "max", "/a", "/b")))  # B redefines /f
    a = settle(ok(base, lit("/a", 7)))  # A changes a different path, /f is only recomputed
    assert [c.path for c in changes_since(base, a)] == ["/a"]
    applied = apply_changes(a, changes_since(base, b))
    assert applied.ok, applied.conflicts
    assert settle(applied.snapshot).values()["/f"] == 7


def test_a_fork_taken_before_the_dependent_values_update_does_not_conflict_with_it() -> None:
    a_unsettled = ok(EMPTY, lit("/a", 1), lit("/b", 2), fn("/f", "sum", "/a", "/b"))
    base = a_unsettled  # B forks while A's update is pending
    a = settle(a_unsettled)
    b = settle(ok(base, fn("/f", "max", "/a", "/b")))
    applied = apply_changes(a, changes_since(base, b))
    assert applied.ok, applied.conflicts


# -- property: coalescing dependent values updates does not change the result -----------------------------------------

PATHS = ["/a", "/b", "/c", "/d", "/e"]
_path = st.sampled_from(PATHS)
_literal = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(["", "x", "yz"]))
_update = st.one_of(
    st.builds(lit, _path, _literal),
    st.builds(rm, _path),
    st.builds(
        lambda path, function, args: fn(path, function, *args),
        _path,
        st.sampled_from(["sum", "concat", "identity", "max"]),
        st.lists(_path, max_size=3),
    ),
)
_batches = st.lists(st.lists(_update, min_size=1, max_size=4), min_size=1, max_size=6)


def _shape(snapshot: Snapshot) -> dict[str, tuple[Any, ...]]:
    return {
        p: (a.value, a.function, a.args, a.error is not None, a.stale)
        for p, a in sorted(snapshot.attributes.items())
    }


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batches)
def test_a_dependent_values_update_per_batch_equals_one_at_the_end(batches: list[list[Update]]) -> None:
    stepwise = EMPTY
    for batch in batches:
        stepwise = dvu(ok(stepwise, *batch))[0]
    coalesced = EMPTY
    for batch in batches:
        coalesced = ok(coalesced, *batch)
    coalesced, order = dvu(coalesced)
    assert set(order) <= {p for p, a in coalesced.attributes.items() if a.is_function}
    assert _shape(stepwise) == _shape(coalesced)
    assert stepwise.values() == coalesced.values()
    assert not any(a.stale for a in stepwise.attributes.values())
    # and the settled result is a fixed point: recomputing everything changes no value
    everything = Snapshot(stepwise.attributes, frozenset(stepwise.attributes))
    assert dvu(everything)[0].values() == stepwise.values()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batches)
def test_settling_without_an_update_is_what_the_update_would_give(batches: list[list[Update]]) -> None:
    # The app clears the roots at apply time when nothing computed is downstream of them, instead of making a DVU
    # due: that must be exactly the DVU's result, and it must decline whenever the DVU has something to compute.
    snapshot = EMPTY
    for batch in batches:
        snapshot = ok(snapshot, *batch)
        settled = settled_without_update(snapshot)
        updated, order = dvu(snapshot)
        if settled is None:
            assert snapshot.roots
        else:
            assert order == [] and settled == updated
        snapshot = updated


def test_literals_nobody_reads_need_no_update_and_a_dependent_does() -> None:
    literals = ok(EMPTY, lit("/a", 1), lit("/b", 2))
    assert settled_without_update(literals) == Snapshot(literals.attributes, frozenset())
    read = ok(settle(literals), fn("/sum", "sum", "/a", "/b"))
    assert settled_without_update(read) is None  # a new function: computed by the DVU
    assert settled_without_update(ok(settle(read), lit("/a", 5))) is None  # /sum reads /a
    assert settled_without_update(ok(settle(read), lit("/c", 5))) is not None  # nobody reads /c
