"""The built-in app's pending snapshots: kept in memory by ``apply``, written once by ``prepare_commit``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import pytest

from rebaser_core.api import EnqueueUpdatesRequest, InlineUpdates, SetLiteral
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet, CommitHooks
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.apps.snapshots.app import EMPTY
from rebaser_server.apps.snapshots.model import Attribute, Snapshot
from rebaser_server.apps.snapshots.objects import ObjectCorrupt
from rebaser_server.apps.snapshots.store import SnapshotStore

CS = ChangeSet(WorkspacePk.new(), ChangeSetId.new())


class FakeStore:
    """The part of ``SnapshotStore`` the app uses, in memory, counting writes."""

    def __init__(self) -> None:
        self.objects: dict[str, Snapshot] = {EMPTY.address: EMPTY}
        self.puts: list[str] = []
        self.cached: dict[str, Snapshot] = {}  # remembered without a write (kept in the record)

    def remember(self, address: str, snapshot: Snapshot, size: int) -> None:
        assert Snapshot.address_of(snapshot.encode()) == address
        self.cached[address] = snapshot

    def size(self, address: str) -> int | None:
        return None

    async def put(self, snapshot: Snapshot, data: bytes | None = None) -> str:
        address = Snapshot.address_of(snapshot.encode() if data is None else data)
        self.puts.append(address)
        self.objects[address] = snapshot
        return address

    async def get(self, address: str, inline: bytes | None = None) -> Snapshot:
        if address in self.objects:
            return self.objects[address]
        if address in self.cached:
            return self.cached[address]
        assert inline is not None and Snapshot.address_of(inline) == address, f"{address} is nowhere"
        return Snapshot.decode(inline)


def app_with_fake_store(inline_bytes: int = 0) -> tuple[SnapshotApp, FakeStore]:
    """The app over a FakeStore; by default every snapshot goes to the store (none is kept in the record)."""
    app, store = SnapshotApp(), FakeStore()
    fake: Any = store
    app._store = fake
    app.limits = replace(app.limits, inline_bytes=inline_bytes)
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


async def test_a_small_snapshot_is_kept_in_the_record_instead_of_the_store() -> None:
    app, store = app_with_fake_store(inline_bytes=1024)
    state = app.initial_state(CS)
    for i in range(3):
        state = (await app.apply(CS, state, request(f"/n{i}", i))).state
    await CommitHooks.of(app).before_commit(CS, state)
    assert store.puts == [] and app._pending == {}
    assert Snapshot.address_of(state["inline"].encode()) == state["snapshot"]
    # Another daemon (nothing pending, nothing cached, the store never saw it) reads it from the state alone.
    other, _ = app_with_fake_store(inline_bytes=1024)
    assert (await other.describe(CS, state, None)).values == {"/n0": 0, "/n1": 1, "/n2": 2}
    # A fork keeps the copy for its own snapshot and for its fork point, which must outlive the source's record.
    forked = other.fork(CS, CS, state)
    assert forked["inline"] == forked["base"]["inline"] == state["inline"]


async def test_a_snapshot_over_the_inline_limit_goes_to_the_store_and_leaves_the_record() -> None:
    app, store = app_with_fake_store(inline_bytes=200)
    small = (await app.apply(CS, app.initial_state(CS), request("/a", 1))).state
    await CommitHooks.of(app).before_commit(CS, small)
    assert "inline" in small and store.puts == []
    large = (await app.apply(CS, small, request("/b", 10**150))).state
    await CommitHooks.of(app).before_commit(CS, large)
    assert "inline" not in large and store.puts == [large["snapshot"]]
    assert "inline" not in app.fork(CS, CS, large)["base"]


async def test_a_record_copy_that_does_not_match_its_address_is_refused() -> None:
    store = SnapshotStore(cast(Any, None), Settings())
    good = Snapshot().encode()
    assert (await store.get(Snapshot.address_of(good), good)).attributes == {}
    with pytest.raises(ObjectCorrupt):
        await store.get(Snapshot.address_of(b"something else"), good)


class _CountingWriter:
    def __init__(self) -> None:
        self.writes: list[str] = []

    async def put_once(self, name: str, data: bytes) -> bool:
        self.writes.append(name)
        return True


async def test_the_store_remembers_a_bounded_number_of_written_addresses() -> None:
    """A snapshot written again costs no round trip while its address is remembered; at most ``cache_size`` are
    (a large change set writes a new snapshot per group, and a daemon runs for months)."""
    store = SnapshotStore(cast(Any, None), Settings(), cache_size=2)
    writer = _CountingWriter()
    store._snapshots, store._writer = cast(Any, object()), cast(Any, writer)
    a, b, c = (Snapshot({"/n": Attribute(value=i)}) for i in range(3))
    for snapshot in (a, b, a):
        await store.put(snapshot)
    assert writer.writes == [a.address, b.address]  # a's second put wrote nothing
    await store.put(c)  # forgets b, the least recently put
    await store.put(a)
    await store.put(b)
    assert writer.writes == [a.address, b.address, c.address, b.address]
    assert len(store._written) == 2
