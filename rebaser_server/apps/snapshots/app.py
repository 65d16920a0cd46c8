"""``SnapshotApp``: the default application. A change set's state is a pointer to its current snapshot.

State (the ``state`` of the framework's change-set record, committed with compare-and-set)::

    {"snapshot": <address>, "base": {"change_set_id": <id>, "snapshot": <address>} | null, "dvu_runs": n}

``base`` is where the change set was forked from; applying a change set onto another (``from_change_set_id``)
carries over what it changed since that fork. Snapshots themselves live in an object store, written once.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client as NatsClient

from rebaser_core.api import (
    ConflictsStatus,
    EnqueueUpdatesRequest,
    SetFunction,
    StoredUpdates,
    SuccessStatus,
    Update,
)
from rebaser_core.errors import UnprocessableError
from rebaser_core.ids import ChangeSetId
from rebaser_core.settings import Settings
from rebaser_server.app import Applied, AppState, ChangeSet, ChangeSetView
from rebaser_server.apps.snapshots.functions import BUILTIN_FUNCTIONS
from rebaser_server.apps.snapshots.model import (
    Function,
    Rebased,
    Snapshot,
    apply_changes,
    changes_since,
    dependent_values_update,
    rebase,
)
from rebaser_server.apps.snapshots.store import SnapshotStore
from rebaser_server.state import ChangeSetStore

__all__ = ["SnapshotApp"]

EMPTY = Snapshot()


class SnapshotApp:
    """Rebase update batches onto change-set snapshots; recompute dependent values.

    Register more functions (pure, JSON in and out) before the daemon starts::

        app = SnapshotApp()
        app.register_function("upper", lambda args: str(args[0]).upper())
    """

    def __init__(self) -> None:
        self.functions: dict[str, Function] = dict(BUILTIN_FUNCTIONS)
        self._store: SnapshotStore | None = None
        self._records: ChangeSetStore | None = None

    def register_function(self, name: str, function: Function) -> None:
        self.functions[name] = function

    async def start(self, nc: NatsClient, settings: Settings) -> None:
        js = nc.jetstream()
        self._store = SnapshotStore(js, settings)
        await self._store.open()
        await self._store.put(EMPTY)
        self._records = ChangeSetStore(js, settings)
        await self._records.open()

    async def stop(self) -> None:
        return None

    @property
    def store(self) -> SnapshotStore:
        if self._store is None:
            raise RuntimeError("SnapshotApp.start() was not called")
        return self._store

    def initial_state(self, change_set: ChangeSet) -> AppState:
        return {"snapshot": EMPTY.address, "base": None, "dvu_runs": 0}

    def fork(self, change_set: ChangeSet, source: ChangeSet, source_state: AppState) -> AppState:
        snapshot = source_state["snapshot"]
        return {
            "snapshot": snapshot,
            "base": {"change_set_id": str(source.change_set_id), "snapshot": snapshot},
            "dvu_runs": 0,
        }

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        current = await self.store.get(state["snapshot"])
        if request.from_change_set_id is not None:
            rebased = await self._apply_change_set(change_set, current, request.from_change_set_id)
        else:
            updates = await self._updates(request)
            self._check_functions(updates)
            rebased = rebase(current, updates)
        if not rebased.ok:
            return Applied(ConflictsStatus(conflicts=list(rebased.conflicts)), state)
        address = await self.store.put(rebased.snapshot)
        status = SuccessStatus(updates_performed=rebased.performed, snapshot_address=address)
        return Applied(status, {**state, "snapshot": address}, dvu=bool(rebased.snapshot.roots))

    def _check_functions(self, updates: list[Update]) -> None:
        # Refused when sent, not stored to fail later as an error value: the caller learns at once (error reply).
        unknown = sorted({u.function for u in updates if isinstance(u, SetFunction)} - set(self.functions))
        if unknown:
            raise UnprocessableError(
                f"unknown function {', '.join(map(repr, unknown))}; known: {', '.join(sorted(self.functions))}"
            )

    async def _updates(self, request: EnqueueUpdatesRequest) -> list[Update]:
        if isinstance(request.updates, StoredUpdates):
            return await self.store.get_batch(request.updates.address)
        return list(request.updates.updates)

    async def _apply_change_set(
        self, target: ChangeSet, current: Snapshot, source_id: ChangeSetId
    ) -> Rebased:
        assert self._records is not None
        record = await self._records.read(ChangeSet(target.workspace_id, source_id))
        if record is None:
            raise UnprocessableError(f"change set {source_id} does not exist")
        base = record.state.get("base") if isinstance(record.state, dict) else None
        if not base:
            raise UnprocessableError(f"change set {source_id} was not forked, so it has no changes to apply")
        changes = changes_since(
            await self.store.get(base["snapshot"]), await self.store.get(record.state["snapshot"])
        )
        return apply_changes(current, changes)

    async def dependent_values_update(self, change_set: ChangeSet, state: AppState) -> AppState:
        snapshot = await self.store.get(state["snapshot"])
        if not snapshot.roots:
            return state
        updated, _order = dependent_values_update(snapshot, self.functions)
        address = await self.store.put(updated)
        return {**state, "snapshot": address, "dvu_runs": state.get("dvu_runs", 0) + 1}

    async def describe(self, change_set: ChangeSet, state: AppState, path: str | None) -> ChangeSetView:
        snapshot = await self.store.get(state["snapshot"])
        attributes: dict[str, Any] = dict(snapshot.attributes)
        if path is not None:
            attributes = {p: a for p, a in attributes.items() if p == path}
        base = state.get("base")
        return ChangeSetView(
            snapshot_address=state["snapshot"],
            values={p: a.value for p, a in attributes.items()},
            versions={p: a.version for p, a in attributes.items()},
            errors={p: a.error for p, a in attributes.items() if a.error is not None},
            forked_from=ChangeSetId(base["change_set_id"]) if base else None,
        )
