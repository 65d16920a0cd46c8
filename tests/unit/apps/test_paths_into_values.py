"""Function arguments that point into an attribute's JSON value (docs/protocol.md §16: ``/web/config/port``)."""

from __future__ import annotations

from rebaser_core.api import Remove, SetFunction, SetLiteral, Update
from rebaser_server.apps.snapshots.dvu import dependent_values_update
from rebaser_server.apps.snapshots.functions import BUILTIN_FUNCTIONS
from rebaser_server.apps.snapshots.model import Snapshot, rebase


def applied(snapshot: Snapshot, updates: list[Update]) -> Snapshot:
    rebased = rebase(snapshot, updates)
    assert rebased.ok
    return dependent_values_update(rebased.snapshot, BUILTIN_FUNCTIONS)[0]


def test_the_documents_example_reads_into_the_json_value() -> None:
    snapshot = applied(
        Snapshot(),
        [
            SetLiteral(path="/components/web/host", value="web.example"),
            SetLiteral(path="/components/web/config", value={"port": 8080, "tags": ["prod", "zürich"]}),
            SetFunction(
                path="/components/web/url",
                function="concat",
                args=["/components/web/host", "/components/web/config/port"],
            ),
            SetFunction(path="/first-tag", function="identity", args=["/components/web/config/tags/0"]),
            SetFunction(path="/nothing", function="identity", args=["/components/web/config/none/deeper"]),
        ],
    )
    assert snapshot.values()["/components/web/url"] == "web.example8080"
    assert snapshot.values()["/first-tag"] == "prod"
    assert snapshot.values()["/nothing"] is None
    assert snapshot.errors() == {}


def test_changing_the_enclosing_value_recomputes_the_dependent() -> None:
    snapshot = applied(
        Snapshot(),
        [SetFunction(path="/port", function="identity", args=["/web/config/port"])],
    )
    assert snapshot.values()["/port"] is None  # nothing there yet
    snapshot = applied(snapshot, [SetLiteral(path="/web/config", value={"port": 1})])
    assert snapshot.values()["/port"] == 1
    snapshot = applied(snapshot, [SetLiteral(path="/web/config", value={"port": 2})])
    assert snapshot.values()["/port"] == 2
    # A closer attribute takes precedence over reading into the outer value.
    snapshot = applied(snapshot, [SetLiteral(path="/web/config/port", value=3)])
    assert snapshot.values()["/port"] == 3
    snapshot = applied(snapshot, [Remove(path="/web/config/port")])
    assert snapshot.values()["/port"] == 2


def test_reading_into_a_computed_value_waits_for_it() -> None:
    snapshot = applied(
        Snapshot(),
        [
            SetFunction(path="/b", function="identity", args=["/a/x"]),
            SetFunction(path="/a", function="identity", args=["/src"]),
            SetLiteral(path="/src", value={"x": "deep"}),
        ],
    )
    assert snapshot.values()["/b"] == "deep"
