"""Applications for tests. ``RecordingApp`` appends each applied request id to the change set's state.

Behaviour is steered by the request's updates (inline ``SetLiteral`` on special paths):

- ``/sleep`` = seconds: sleep inside apply (to be caught mid-request);
- ``/hang`` = anything: never return (the watchdog must give up);
- ``/poison`` = anything: ``UnprocessableError``;
- ``/flaky`` = n: ``RetryableError`` for the first n attempts of that request (counted in this process);
- ``/dvu`` = anything: ask for a dependent-values update;
- ``/exit`` = anything: end the process at once (``os._exit``), as an OOM kill would;
- ``/block`` = seconds: a blocking sleep that freezes the whole event loop.

With ``REBASER_TEST_RECORD`` set (subprocess daemons), every apply's start and end go to that JSONL file; a start
also says whether it came after the deadline the daemon's lease check gave the step (``late``: the process stalled
between the check and the app, as a SIGSTOP there would stop it).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter, defaultdict
from typing import Any

from nats.aio.client import Client as NatsClient

from rebaser_core.api import EnqueueUpdatesRequest, InlineUpdates, SetLiteral, SuccessStatus
from rebaser_core.errors import RetryableError, UnprocessableError
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_server.app import Applied, AppState, ChangeSet, lease_left
from rebaser_server.record.store import ChangeSetStore
from tests.support.kv_faults import install_from_env

# Subprocess daemons import this module as their app: the KV fault switch (tests/support/kv_faults.py) is
# installed here.
install_from_env()


def _controls(request: EnqueueUpdatesRequest) -> dict[str, Any]:
    if not isinstance(request.updates, InlineUpdates):
        return {}
    return {u.path: u.value for u in request.updates.updates if isinstance(u, SetLiteral)}


class RecordingApp:
    def __init__(self) -> None:
        self.active: Counter[str] = Counter()
        self.overlaps: list[str] = []
        self.attempts: Counter[str] = Counter()
        self.dvu_runs: defaultdict[str, int] = defaultdict(int)
        self.dvu_gate: asyncio.Event | None = None  # set by a test to hold DVU runs
        self._record = os.environ.get("REBASER_TEST_RECORD")

    async def start(self, nc: NatsClient, settings: Settings) -> None:
        return None

    async def stop(self) -> None:
        return None

    def initial_state(self, change_set: ChangeSet) -> AppState:
        return {"applied": [], "dvu_runs": 0}

    def _log(self, event: str, change_set: ChangeSet, request_id: str) -> None:
        if self._record:
            entry = {
                "e": event,
                "cs": str(change_set),
                "rid": request_id,
                "pid": os.getpid(),
                "t": time.time(),
            }
            if event == "start":
                left = lease_left()
                entry["late"] = left is not None and left < 0
            line = json.dumps(entry)
            with open(self._record, "a") as f:
                f.write(line + "\n")

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        key, rid = str(change_set), str(request.id)
        self.active[key] += 1
        if self.active[key] > 1:
            self.overlaps.append(key)
        self._log("start", change_set, rid)
        try:
            controls = _controls(request)
            self.attempts[rid] += 1
            if "/sleep" in controls:
                await asyncio.sleep(float(controls["/sleep"]))
            if "/hang" in controls:
                await asyncio.Event().wait()
            if "/poison" in controls:
                raise UnprocessableError("poison request")
            if "/flaky" in controls and self.attempts[rid] <= int(controls["/flaky"]):
                raise RetryableError(f"flaky attempt {self.attempts[rid]}")
            if "/exit" in controls:
                os._exit(3)  # a request that kills the process (as an OOM kill or a segfault would)
            if "/block" in controls:
                time.sleep(float(controls["/block"]))  # noqa: ASYNC251 (the point: a call that blocks the loop)
            new_state = {**state, "applied": [*state["applied"], rid]}
            return Applied(SuccessStatus(updates_performed=1), new_state, dvu="/dvu" in controls)
        finally:
            self._log("end", change_set, rid)  # also when it failed or was cancelled: the apply is over
            self.active[key] -= 1

    async def dependent_values_update(self, change_set: ChangeSet, state: AppState) -> AppState:
        if self.dvu_gate is not None:
            await self.dvu_gate.wait()
        self.dvu_runs[str(change_set)] += 1
        return {**state, "dvu_runs": state["dvu_runs"] + 1}


class GatedApp(RecordingApp):
    """A ``RecordingApp`` that holds every request setting ``/gate`` until the test opens ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.held = 0  # requests that reached the gate

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        if "/gate" in _controls(request):
            self.held += 1
            await self.gate.wait()
        return await super().apply(change_set, state, request)


async def applied(store: ChangeSetStore, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> list[str]:
    """The request ids a ``RecordingApp`` change set has applied, in order (committed state)."""
    record = await store.read(ChangeSet(workspace_id, change_set_id))
    return [] if record is None else list(record.state["applied"])
