"""``App``: the base class of an application, with the contract's defaults, so an app writes only what it does.

Subclass it and write ``initial_state`` and ``apply``; everything else has a default that is right for an app that
keeps its whole state in the change set's record (a JSON object):

- ``start`` and ``stop`` do nothing;
- ``dependent_values_update`` leaves the state as it is;
- ``apply_change_set`` refuses the request (an app that does not merge change sets must say so, not answer
  success with nothing done);
- ``describe`` shows a dict state's top-level keys as paths (``{"total": 3}`` is ``/total``), any other state as
  ``/``;
- ``fork`` starts the new change set from a copy of the source's state.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import Any

from nats.aio.client import Client as NatsClient

from rebaser_core.api import EnqueueUpdatesRequest
from rebaser_core.errors import RefusedError
from rebaser_core.settings import Settings
from rebaser_server.app.contract import Applied, AppState, ChangeSet, ChangeSetView, Committed

__all__ = ["App"]


class App(ABC):
    """An application with every optional part of the contract given a default (see the module's docstring)."""

    async def start(self, nc: NatsClient, settings: Settings) -> None:
        """Open what the app needs (stores, buckets); called before any request, and retried like the daemon's
        own set-up if it raises a NATS error, a ``TimeoutError`` or an ``OSError``."""
        return None

    async def stop(self) -> None:
        """Release what ``start`` opened."""
        return None

    @abstractmethod
    def initial_state(self, change_set: ChangeSet) -> AppState:
        """The state of a change set that has never been written."""

    @abstractmethod
    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        """Apply one request to ``state``."""

    async def dependent_values_update(self, change_set: ChangeSet, state: AppState) -> AppState:
        """Recompute what depends on other values; by default there is nothing to recompute."""
        return state

    async def apply_change_set(
        self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest, source: Committed
    ) -> Applied:
        """Apply change set ``source`` onto this one; by default refused."""
        raise RefusedError(
            f"{type(self).__name__} does not apply one change set onto another (from_change_set_id)",
            {"unsupported": "from_change_set_id"},
        )

    async def describe(self, change_set: ChangeSet, state: AppState, path: str | None) -> ChangeSetView:
        """What a ``get`` shows: a dict state's top-level keys as paths, any other state as ``/``."""
        values: dict[str, Any] = (
            {f"/{key}": value for key, value in state.items()} if isinstance(state, dict) else {"/": state}
        )
        if path is not None:
            values = {path: values[path]} if path in values else {}
        return ChangeSetView(values=values)

    def fork(self, change_set: ChangeSet, source: ChangeSet, source_state: AppState) -> AppState:
        """A new change set starts as a copy of the source's state."""
        return copy.deepcopy(source_state)
