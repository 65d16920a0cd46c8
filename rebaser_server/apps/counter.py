"""``CounterApp``: the smallest application: it counts requests and updates, and nothing else.

Use it to measure the framework's own cost (``bench/``). It implements the bare :class:`RebaserApp` protocol
(no base class), so it has none of the optional parts: a request with ``from_change_set_id`` is refused, and so
are ``get`` and ``fork`` queries. ``examples/cart`` is the example to copy (see ``docs/apps.md``).
"""

from __future__ import annotations

from nats.aio.client import Client as NatsClient

from rebaser_core.api import EnqueueUpdatesRequest, SuccessStatus
from rebaser_core.settings import Settings
from rebaser_server.app import Applied, AppState, ChangeSet

__all__ = ["CounterApp"]


class CounterApp:
    async def start(self, nc: NatsClient, settings: Settings) -> None:
        return None

    async def stop(self) -> None:
        return None

    def initial_state(self, change_set: ChangeSet) -> AppState:
        return {"requests": 0, "updates": 0}

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        updates = len(await change_set.updates(request))  # inline, or read from the stored batch
        new_state = {"requests": state["requests"] + 1, "updates": state["updates"] + updates}
        return Applied(SuccessStatus(updates_performed=updates), new_state)

    async def dependent_values_update(self, change_set: ChangeSet, state: AppState) -> AppState:
        return state
