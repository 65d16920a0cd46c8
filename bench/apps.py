"""An application for the DVU burst: the built-in app with its dependent values update made ``factor`` times as
costly as a request (``REBASER_BENCH_DVU_FACTOR``, default 10).

The extra cost is CPU on the event loop (a busy wait), like a real CPU-bound DVU. A request's cost is measured in
this process as the running mean of the time between two applies while requests stream in back to back (the whole
per-request cost: framework, app and NATS round trips, not only the app's own step), so "10x" holds on a fast and a
slow machine alike.
"""

from __future__ import annotations

import os
import time

from rebaser_core.api import EnqueueUpdatesRequest
from rebaser_server.app import Applied, AppState, ChangeSet
from rebaser_server.apps.snapshots import SnapshotApp

__all__ = ["CostlyDvuApp"]

# Weight of the newest gap in the running mean; gaps longer than _BUSY_GAP are idle time, not a request's cost.
_ALPHA = 0.05
_BUSY_GAP = 0.05


class CostlyDvuApp(SnapshotApp):
    def __init__(self) -> None:
        super().__init__()
        self.factor = float(os.environ.get("REBASER_BENCH_DVU_FACTOR", "10"))
        self.request_cost = 0.0
        self._last_apply = 0.0

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        now = time.perf_counter()
        gap, self._last_apply = now - self._last_apply, now
        if gap < _BUSY_GAP:
            cost = self.request_cost
            self.request_cost = gap if not cost else (1 - _ALPHA) * cost + _ALPHA * gap
        return await super().apply(change_set, state, request)

    async def dependent_values_update(self, change_set: ChangeSet, state: AppState) -> AppState:
        updated = await super().dependent_values_update(change_set, state)
        until = time.perf_counter() + self.factor * self.request_cost
        while time.perf_counter() < until:
            pass
        self._last_apply = time.perf_counter()  # the next gap measures requests, not this run
        return updated
