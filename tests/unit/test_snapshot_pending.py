"""The built-in app's pending snapshots: kept in memory by ``apply``, written once by ``prepare_commit``."""

from __future__ import annotations

from typing import Any

from rebaser_core.api import EnqueueUpdatesRequest, InlineUpdates, SetLiteral
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_server.app import ChangeSet, CommitHooks
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.apps.snapshots.app import EMPTY
from rebaser_server.apps.snapshots.model import Snapshot

CS = ChangeSet(WorkspacePk.new(), ChangeSetId.new())


class FakeStore:
    """The part of ``SnapshotStore`` the app uses, in memory, counting writes."""

    def __init__(self) -> None:
        self.objects: dict[str, Snapshot] = {EMPTY.address: EMPTY}
        self.puts: list[str] = []

    def size(self, address: str) -> int | None:
        return None

    async def put(self, snapshot: Snapshot, data: bytes | None = None) -> str:
        address = Snapshot.address_of(snapshot.encode() if data is None else data)
        self.puts.append(address)
        self.objects[address] = snapshot
        return address

    async def get(self, address: str) -> Snapshot:
        return self.objects[address]


def app_with_fake_store() -> tuple[SnapshotApp, FakeStore]:
    app, store = SnapshotApp(), FakeStore()
    fake: Any = store
    app._store = fake
    return app, store


def request(path: str, value: int) -> EnqueueUpdatesRequest:
    return EnqueueUpdatesRequest(
        id=RequestId.new(),
        workspace_id=CS.workspace_id,
        change_set_id=CS.change_set_id,
        updates=InlineUpdates(updates=[SetLiteral(path=path, value=value)]),
    )


async def test_a_group_writes_only_the_committed_snapshot() -> None:
    app, store = app_with_fake_store()
    state = app.initial_state(CS)
    for i in range(5):
        state = (await app.apply(CS, state, request(f"/n{i}", i))).state
    assert store.puts == []  # nothing written while the group is applied
    # A query of the committed state while the group is open neither fails nor disturbs the group.
    assert (await app.describe(CS, app.initial_state(CS), None)).values == {}
    state = (await app.apply(CS, state, request("/n5", 5))).state
    await CommitHooks.of(app).before_commit(CS, state)
    assert store.puts == [state["snapshot"]]
    assert app._pending == {}
    assert set((await app.describe(CS, state, None)).values) == {f"/n{i}" for i in range(6)}


async def test_pending_snapshots_are_bounded_and_dropped_when_the_group_is_abandoned() -> None:
    app, store = app_with_fake_store()
    state = app.initial_state(CS)
    for i in range(10):
        state = (await app.apply(CS, state, request(f"/n{i}", i))).state
        assert len(app._pending[CS]) <= 2  # the group's latest snapshot and the new one
    CommitHooks.of(app).abandoned(CS)
    assert app._pending == {} and store.puts == []
    # An apply from the committed state after an abandoned group (no abandon hook called) drops the leftovers too.
    app_state = (await app.apply(CS, app.initial_state(CS), request("/x", 1))).state
    await app.apply(CS, app.initial_state(CS), request("/y", 1))
    assert app_state["snapshot"] not in app._pending[CS] and len(app._pending[CS]) == 1
