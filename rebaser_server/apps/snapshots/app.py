"""``SnapshotApp``: the default application. A change set's state is a pointer to its current snapshot.

State (the ``state`` of the framework's change-set record, committed with compare-and-set)::

    {"snapshot": <address>, "inline": <JSON text>?,
     "base": {"change_set_id": <id>, "snapshot": <address>, "inline": <JSON text>?} | null, "dvu_runs": n}

``base`` is where the change set was forked from; applying a change set onto another (``from_change_set_id``)
carries over what it changed since that fork. Snapshots live in an object store, written once, except small ones
(``snapshot_inline_bytes``, 16 KiB by default): those are kept in the record itself (``inline``, the snapshot's
encoding as text, so that a state stays in the JSON data model). Committing a request is then one record write,
not a record write after two object-store round trips (chunk, then info). A fork copies the source's ``inline``
into its ``base`` too: the source's record moves on, and the fork point must stay readable.

A new snapshot is not written when it is computed: requests are committed in groups, and only the snapshot of the
state a commit holds is ever referenced, so ``apply`` keeps its snapshots *pending* in memory (the next request
of the group reads them there) and ``prepare_commit`` writes the committed one just before the record is
committed: one object write per group instead of one per request, and never a record pointing to a missing
snapshot. The pending snapshots of a change set are dropped at each commit and whenever its group ends.

Requests over the limits in ``Settings`` are refused (``limits.OverLimit``). The pure work of a step (rebase,
dependent values update, encoding the snapshot) runs in a worker thread when the snapshot or the batch is large,
so one huge change set does not stall the event loop that serves health, progress acks and the other change sets;
small steps stay on the loop, where they cost less than the thread hop (and never wait behind huge ones). The model
is pure and every snapshot immutable, so the thread shares nothing mutable with the loop; registered functions
must be pure too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from nats.aio.client import Client as NatsClient

from rebaser_core.api import (
    ConflictsStatus,
    EnqueueUpdatesRequest,
    SetFunction,
    SuccessStatus,
    Update,
)
from rebaser_core.errors import RefusedError, UnprocessableError
from rebaser_core.ids import ChangeSetId
from rebaser_core.nats.requester import Requester
from rebaser_core.settings import Settings
from rebaser_server.app import Applied, AppState, ChangeSet, ChangeSetView, Committed
from rebaser_server.apps.snapshots.dvu import dependent_values_update, settled_without_update
from rebaser_server.apps.snapshots.functions import BUILTIN_FUNCTIONS
from rebaser_server.apps.snapshots.limits import Limits, check_growth, check_updates
from rebaser_server.apps.snapshots.model import (
    Attribute,
    Change,
    Function,
    Rebased,
    Snapshot,
    apply_changes,
    changes_since,
    rebase,
)
from rebaser_server.apps.snapshots.store import OFF_LOOP_BYTES, SnapshotStore

__all__ = ["SnapshotApp"]

EMPTY = Snapshot()
T = TypeVar("T")

# A step over this many attributes plus updates (or a snapshot over OFF_LOOP_BYTES) runs in a worker thread.
_OFF_LOOP_ITEMS = 2_000


def _rebased(current: Snapshot, updates: Sequence[Update], limits: Limits) -> tuple[Rebased, bytes]:
    check_updates(updates, limits)
    return _checked(current, _settled(rebase(current, updates)), limits)


def _merged(current: Snapshot, base: Snapshot, source: Snapshot, limits: Limits) -> tuple[Rebased, bytes]:
    changes: list[Change] = changes_since(base, source)
    return _checked(current, _settled(apply_changes(current, changes)), limits)


def _settled(rebased: Rebased) -> Rebased:
    """When nothing computed depends on what changed (literals only, say), the DVU's whole work would be to clear
    the roots: done here instead, so the request makes no DVU due (a record commit and a snapshot write fewer)."""
    if not rebased.ok:
        return rebased
    settled = settled_without_update(rebased.snapshot)
    return rebased if settled is None else replace(rebased, snapshot=settled)


def _checked(current: Snapshot, rebased: Rebased, limits: Limits) -> tuple[Rebased, bytes]:
    """The result and its encoding (for the store), refused if it takes the snapshot over the limits."""
    if not rebased.ok:
        return rebased, b""
    data = rebased.snapshot.encode()
    # The current size is only needed (and only measured) when the result is over the limit.
    before = len(current.encode()) if len(data) > limits.max_snapshot_bytes else 0
    check_growth((len(current.attributes), before), (len(rebased.snapshot.attributes), len(data)), limits)
    return rebased, data


def _conflicts_status(rebased: Rebased) -> ConflictsStatus:
    return ConflictsStatus(conflicts=list(rebased.conflicts))


def _updated(
    snapshot: Snapshot, functions: dict[str, Function], limits: Limits, size: int | None
) -> tuple[Snapshot, bytes]:
    updated, _order = dependent_values_update(snapshot, functions, limits, encoded_size=size)
    return updated, updated.encode()


class SnapshotApp:
    """Rebase update batches onto change-set snapshots; recompute dependent values.

    Register more functions (pure, JSON in and out) before the daemon starts::

        app = SnapshotApp()
        app.register_function("upper", lambda args: str(args[0]).upper())
    """

    def __init__(self) -> None:
        self.functions: dict[str, Function] = dict(BUILTIN_FUNCTIONS)
        self._store: SnapshotStore | None = None
        self._requester: Requester | None = None
        self.limits = Limits()
        # Per change set: the snapshots computed since its last commit (address -> snapshot and its encoding).
        self._pending: dict[ChangeSet, dict[str, tuple[Snapshot, bytes]]] = {}

    def register_function(self, name: str, function: Function) -> None:
        self.functions[name] = function

    async def start(self, nc: NatsClient, settings: Settings) -> None:
        js = nc.jetstream()
        self.limits = Limits.from_settings(settings)
        self._requester = Requester(nc)
        self._store = SnapshotStore(js, settings, requester=self._requester)
        await self._store.open()
        await self._store.put(EMPTY)

    async def stop(self) -> None:
        requester, self._requester = self._requester, None
        if requester is not None:
            with contextlib.suppress(Exception):
                await requester.close()

    @property
    def store(self) -> SnapshotStore:
        if self._store is None:
            raise RuntimeError("SnapshotApp.start() was not called")
        return self._store

    def initial_state(self, change_set: ChangeSet) -> AppState:
        return {"snapshot": EMPTY.address, "base": None, "dvu_runs": 0}

    def fork(self, change_set: ChangeSet, source: ChangeSet, source_state: AppState) -> AppState:
        snapshot = _reference(source_state)
        return {**snapshot, "base": {"change_set_id": str(source.change_set_id), **snapshot}, "dvu_runs": 0}

    def _pointing_to(self, state: AppState, address: str, data: bytes) -> AppState:
        """``state`` moved to the snapshot ``address`` encoded as ``data``: kept in the record if small enough."""
        moved = {**state, "snapshot": address}
        if len(data) <= self.limits.inline_bytes:
            moved["inline"] = data.decode()  # the snapshot's JSON: UTF-8 by construction
        else:
            moved.pop("inline", None)
        return moved

    def _large(self, change_set: ChangeSet, state: AppState, items: int) -> bool:
        size = self._size(change_set, state)
        return items > _OFF_LOOP_ITEMS or size is None or size > OFF_LOOP_BYTES

    def _size(self, change_set: ChangeSet, state: AppState) -> int | None:
        address, inline = state["snapshot"], _inline(state)
        pending = self._pending.get(change_set, {}).get(address)
        if pending is not None:
            return len(pending[1])
        return self.store.size(address) if inline is None else len(inline)

    async def _load(self, change_set: ChangeSet, state: AppState, *, step: bool = True) -> Snapshot:
        """The snapshot ``state`` points to: pending (computed in this group, not written yet), kept in the record
        (``inline``) or stored.

        ``step``: an ``apply`` or DVU (never concurrent with another for the change set), which starts from the
        group's latest staged state: only that state can still be committed, so every other pending snapshot is
        dropped (at most two are kept: this one and the step's result, however large the group). One that starts
        from a state that is not pending starts from a committed one: whatever is pending belongs to a group that
        was never committed. A query reads committed states while a group is open and must leave it alone."""
        address = state["snapshot"]
        pending = self._pending.get(change_set)
        if pending is not None:
            kept = pending.get(address)
            if kept is not None:
                if step and len(pending) > 1:
                    self._pending[change_set] = {address: kept}
                return kept[0]
            if step:
                del self._pending[change_set]
        return await self.store.get(address, _inline(state))

    def _keep(self, change_set: ChangeSet, snapshot: Snapshot, data: bytes) -> str:
        """Keep a new snapshot pending until its state is committed (``prepare_commit``); return its address."""
        address = Snapshot.address_of(data)
        self._pending.setdefault(change_set, {})[address] = (snapshot, data)
        return address

    async def prepare_commit(self, change_set: ChangeSet, state: AppState) -> None:
        """Write the snapshot ``state`` points to, if it is pending, before the record holding it is committed;
        not if the record holds it (``inline``)."""
        pending = self._pending.pop(change_set, None)
        kept = None if pending is None else pending.get(state["snapshot"])
        if kept is None:
            return
        if "inline" in state:
            # Not written, but cached: the next request of the change set starts from it, and decoding it again
            # from the record's copy (hash, parse, build) costs a few percent of a daemon's CPU per request.
            # Content-addressed and immutable, so a cached snapshot whose commit then fails harms nothing.
            snapshot, data = kept
            self.store.remember(state["snapshot"], snapshot, len(data))
            return
        # If this fails, nothing is committed and the group is processed again from the committed state.
        await self.store.put(*kept)

    def abandon_commit(self, change_set: ChangeSet) -> None:
        """The group ended (committed or not): no pending snapshot of it can be committed any more."""
        self._pending.pop(change_set, None)

    async def _run(self, large: bool, work: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(work, *args) if large else work(*args)

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        current = await self._load(change_set, state)
        updates = await change_set.updates(request)
        self._check_functions(updates)
        large = self._large(change_set, state, len(current.attributes) + len(updates))
        rebased, data = await self._run(large, _rebased, current, updates, self.limits)
        return await self._applied(change_set, state, rebased, data, large)

    async def apply_change_set(
        self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest, source: Committed
    ) -> Applied:
        """Carry over what ``source`` changed since it was forked."""
        current = await self._load(change_set, state)
        base, now = await self._fork_point(source)
        # Three snapshots compared and hashed path by path: rare enough to always take a thread.
        rebased, data = await self._run(True, _merged, current, base, now, self.limits)
        return await self._applied(change_set, state, rebased, data, True)

    async def _applied(
        self, change_set: ChangeSet, state: AppState, rebased: Rebased, data: bytes, large: bool
    ) -> Applied:
        if not rebased.ok:
            # Validating 20,000 conflicts before the status keeps the first 100 is work too.
            conflicts = await self._run(large, _conflicts_status, rebased)
            return Applied(conflicts, state)
        address = self._keep(change_set, rebased.snapshot, data)
        status = SuccessStatus(updates_performed=rebased.performed, snapshot_address=address)
        return Applied(status, self._pointing_to(state, address, data), dvu=bool(rebased.snapshot.roots))

    def _check_functions(self, updates: list[Update]) -> None:
        # Refused when sent, not stored to fail later as an error value: the caller learns at once (error reply).
        unknown = sorted({u.function for u in updates if isinstance(u, SetFunction)} - set(self.functions))
        if unknown:
            raise UnprocessableError(
                f"unknown function {', '.join(map(repr, unknown))}; known: {', '.join(sorted(self.functions))}"
            )

    async def _fork_point(self, source: Committed) -> tuple[Snapshot, Snapshot]:
        """The source change set's snapshot at its fork, and now."""
        state = source.state
        base = state.get("base") if isinstance(state, dict) else None
        if not base:
            raise RefusedError(
                f"change set {source.change_set.change_set_id} was not forked, so it has no changes to apply",
                {"from_change_set_id": str(source.change_set.change_set_id)},
            )
        return (
            await self.store.get(base["snapshot"], _inline(base)),
            await self.store.get(state["snapshot"], _inline(state)),
        )

    async def dependent_values_update(self, change_set: ChangeSet, state: AppState) -> AppState:
        snapshot = await self._load(change_set, state)
        if not snapshot.roots:
            return state
        large = self._large(change_set, state, len(snapshot.attributes))
        size = self._size(change_set, state)
        updated, data = await self._run(large, _updated, snapshot, self.functions, self.limits, size)
        address = self._keep(change_set, updated, data)
        return {**self._pointing_to(state, address, data), "dvu_runs": state.get("dvu_runs", 0) + 1}

    async def describe(self, change_set: ChangeSet, state: AppState, path: str | None) -> ChangeSetView:
        snapshot = await self._load(change_set, state, step=False)
        base = state.get("base")
        forked_from = ChangeSetId(base["change_set_id"]) if base else None
        if path is not None:
            attribute = snapshot.attributes.get(path)
            return _view(state["snapshot"], {} if attribute is None else {path: attribute}, forked_from)
        # Every attribute's version is a hash: for a large snapshot, that is work for a thread too.
        large = self._large(change_set, state, len(snapshot.attributes))
        return await self._run(large, _view, state["snapshot"], snapshot.attributes, forked_from)


def _inline(reference: Mapping[str, Any]) -> bytes | None:
    """The snapshot a state (or its ``base``) keeps in the record, if it keeps one."""
    inline = reference.get("inline")
    return inline.encode() if isinstance(inline, str) else None


def _reference(state: AppState) -> dict[str, Any]:
    """What names the snapshot ``state`` points to: its address, and its encoding if the record keeps it."""
    inline = state.get("inline")
    return (
        {"snapshot": state["snapshot"]}
        if inline is None
        else {"snapshot": state["snapshot"], "inline": inline}
    )


def _view(
    address: str, attributes: Mapping[str, Attribute], forked_from: ChangeSetId | None
) -> ChangeSetView:
    return ChangeSetView(
        snapshot_address=address,
        values={p: a.value for p, a in attributes.items()},
        versions={p: a.version for p, a in attributes.items()},
        errors={p: a.error for p, a in attributes.items() if a.error is not None},
        forked_from=forked_from,
    )
