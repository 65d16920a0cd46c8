"""docs/apps.md shows the example app and its tests as they are in examples/cart (which the tooling tests run),
and the app contract's helpers behave as the guide says."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from rebaser_core.api import EnqueueUpdatesRequest, InlineUpdates, SetLiteral
from rebaser_core.errors import RefusedError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_server.app import App, Applied, AppState, ChangeSet, load_app, make_app
from rebaser_server.app.calls import apply_request, capabilities
from rebaser_server.apps.counter import CounterApp
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.testing import MemoryReader

ROOT = Path(__file__).resolve().parents[3]
GUIDE = (ROOT / "docs" / "apps.md").read_text()


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE, flags=re.S)


@pytest.mark.parametrize("name", ["cart.py", "test_cart.py"])
def test_the_guide_shows_the_example_as_it_is(name: str) -> None:
    assert (ROOT / "examples" / "cart" / name).read_text() in _blocks()


class Minimal(App):
    def initial_state(self, change_set: ChangeSet) -> AppState:
        return {"n": 0}

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        return Applied.success({"n": state["n"] + 1}, 1)


def _request(cs: ChangeSet, source: ChangeSetId | None = None) -> EnqueueUpdatesRequest:
    return EnqueueUpdatesRequest(
        id=RequestId.new(),
        workspace_id=cs.workspace_id,
        change_set_id=cs.change_set_id,
        updates=InlineUpdates(updates=[SetLiteral(path="/a", value=1)]),
        from_change_set_id=source,
    )


def test_the_base_class_defaults() -> None:
    source = ChangeSetId.new()
    app, cs = Minimal(), ChangeSet(WorkspacePk.new(), ChangeSetId.new(), MemoryReader({source: {"n": 1}}))
    state = {"n": 2, "items": [1]}
    assert asyncio.run(app.dependent_values_update(cs, state)) is state
    view = asyncio.run(app.describe(cs, state, None))
    assert view.values == {"/n": 2, "/items": [1]}
    assert asyncio.run(app.describe(cs, state, "/n")).values == {"/n": 2}
    assert asyncio.run(app.describe(cs, state, "/missing")).values == {}
    forked = app.fork(cs, cs, state)
    assert forked == state and forked["items"] is not state["items"]  # a copy
    with pytest.raises(RefusedError, match="from_change_set_id"):
        asyncio.run(apply_request(app, cs, state, _request(cs, source)))


def test_a_request_from_another_change_set_is_refused_unless_the_app_merges_and_the_source_exists() -> None:
    source = ChangeSetId.new()
    cs = ChangeSet(WorkspacePk.new(), ChangeSetId.new(), MemoryReader({source: {"n": 5}}))
    with pytest.raises(RefusedError, match="does not apply one change set onto another"):
        asyncio.run(apply_request(CounterApp(), cs, {}, _request(cs, source)))

    class Merging(Minimal):
        async def apply_change_set(self, change_set, state, request, source):  # type: ignore[no-untyped-def]
            return Applied.success({"n": state["n"] + source.state["n"]})

    assert asyncio.run(apply_request(Merging(), cs, {"n": 1}, _request(cs, source))).state == {"n": 6}
    with pytest.raises(RefusedError, match="does not exist"):
        asyncio.run(apply_request(Merging(), cs, {"n": 1}, _request(cs, ChangeSetId.new())))
    with pytest.raises(RefusedError, match="onto itself"):
        asyncio.run(apply_request(Merging(), cs, {"n": 1}, _request(cs, cs.change_set_id)))


def test_a_change_set_is_equal_by_its_ids_alone_and_says_when_it_cannot_read() -> None:
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    assert ChangeSet(wk, cs) == ChangeSet(wk, cs, MemoryReader())
    assert hash(ChangeSet(wk, cs)) == hash(ChangeSet(wk, cs, MemoryReader()))
    with pytest.raises(RuntimeError, match="MemoryReader"):
        asyncio.run(ChangeSet(wk, cs).read(ChangeSetId.new()))


def test_the_start_up_line_says_what_an_app_lacks() -> None:
    assert capabilities(CounterApp()).endswith(
        "lacks apply_change_set (requests with from_change_set_id are refused); describe (get queries are "
        "answered with an error); fork (fork queries are answered with an error)"
    )
    assert capabilities(SnapshotApp()).endswith("serves requests, from_change_set_id, get and fork")
    assert capabilities(Minimal()).endswith("serves requests, from_change_set_id, get and fork")


def test_loading_an_app_takes_a_class_a_factory_or_an_object_and_says_what_is_wrong() -> None:
    assert isinstance(load_app("rebaser_server.apps.counter:CounterApp"), CounterApp)
    assert isinstance(make_app(CounterApp, "x"), CounterApp)
    app = CounterApp()
    assert make_app(app, "x") is app
    assert isinstance(make_app(lambda: app, "x"), CounterApp)
    with pytest.raises(TypeError, match="lacks start, stop, initial_state, apply, dependent_values_update"):
        make_app(42, "the answer")
    with pytest.raises(ValueError) as no_attribute:
        load_app("rebaser_server.apps.counter")
    assert str(no_attribute.value).count("module:attribute") == 1
