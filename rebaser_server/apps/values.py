"""A small built-in application: a change set is a map of attribute paths to values.

It is the default ``--app`` until the snapshot application lands, and a readable example of the app contract:
``set`` stores a literal, ``set_function`` stores a function of other attributes that the dependent-values update
computes (``identity``, ``sum``, ``concat``), ``remove`` deletes. Every attribute carries a version that changes
when it changes; an update with an ``expected_version`` that no longer matches makes the whole batch a conflict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient

from rebaser_core.api import (
    Conflict,
    ConflictsStatus,
    EnqueueUpdatesRequest,
    InlineUpdates,
    Remove,
    SetFunction,
    SetLiteral,
    SuccessStatus,
)
from rebaser_core.errors import UnprocessableError
from rebaser_core.settings import Settings
from rebaser_server.app import Applied, AppState, ChangeSet

__all__ = ["ValuesApp"]

_FUNCTIONS: dict[str, Callable[[list[Any]], Any]] = {
    "identity": lambda args: args[0] if args else None,
    "sum": lambda args: sum(a for a in args if isinstance(a, int | float) and not isinstance(a, bool)),
    "concat": lambda args: "".join("" if a is None else str(a) for a in args),
}


class ValuesApp:
    async def start(self, nc: NatsClient, settings: Settings) -> None:
        return None

    async def stop(self) -> None:
        return None

    def initial_state(self, change_set: ChangeSet) -> AppState:
        return {"values": {}, "versions": {}, "functions": {}, "dvu_runs": 0}

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        if request.from_change_set_id is not None:
            raise UnprocessableError("ValuesApp does not apply one change set onto another")
        if not isinstance(request.updates, InlineUpdates):
            raise UnprocessableError("ValuesApp only takes inline updates")
        versions: dict[str, int] = state["versions"]
        conflicts = [
            Conflict(
                path=u.path, expected_version=u.expected_version, actual_version=_version(versions, u.path)
            )
            for u in request.updates.updates
            if u.expected_version is not None and u.expected_version != _version(versions, u.path)
        ]
        if conflicts:
            return Applied(ConflictsStatus(conflicts=conflicts), state)
        values, functions = dict(state["values"]), dict(state["functions"])
        versions = dict(versions)
        dvu = False
        for update in request.updates.updates:
            versions[update.path] = versions.get(update.path, 0) + 1
            functions.pop(update.path, None)
            if isinstance(update, SetLiteral):
                values[update.path] = update.value
            elif isinstance(update, SetFunction):
                if update.function not in _FUNCTIONS:
                    raise UnprocessableError(f"unknown function {update.function!r}")
                functions[update.path] = {"function": update.function, "args": update.args}
                dvu = True
            elif isinstance(update, Remove):
                values.pop(update.path, None)
            dvu = dvu or any(update.path in f["args"] for f in functions.values())
        new_state = {**state, "values": values, "versions": versions, "functions": functions}
        return Applied(SuccessStatus(updates_performed=len(request.updates.updates)), new_state, dvu=dvu)

    async def dependent_values_update(self, change_set: ChangeSet, state: AppState) -> AppState:
        values: dict[str, Any] = dict(state["values"])
        functions: dict[str, Any] = state["functions"]
        # Repeat until stable (bounded by the number of functions: a chain of n resolves in n passes).
        for _ in range(len(functions) + 1):
            changed = False
            for path, spec in functions.items():
                value = _FUNCTIONS[spec["function"]]([values.get(a) for a in spec["args"]])
                if values.get(path) != value:
                    values[path], changed = value, True
            if not changed:
                break
        return {**state, "values": values, "dvu_runs": state["dvu_runs"] + 1}


def _version(versions: dict[str, int], path: str) -> str | None:
    v = versions.get(path)
    return None if v is None else str(v)
