"""``WaitSettled`` v1 on ``[P.]rebaser.api.settled.<workspace>.<change_set>``: wait until a change set is settled.

A change set is *settled* when every request stored for it has been processed and no dependent values update is
due (or none can run: nothing owns the change set, so a DVU left due by a failing app waits for the next request).
The daemon answering holds the reply until then, at most ``timeout`` seconds (and at most ``MAX_SETTLED_WAIT``),
so the caller does not poll; see docs/protocol.md §13.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from rebaser_core.api.versioned import MessageVersion, VersionedMessage
from rebaser_core.ids import ChangeSetId, WorkspacePk

__all__ = [
    "MAX_SETTLED_WAIT",
    "WAIT_SETTLED_REQUEST",
    "WAIT_SETTLED_RESPONSE",
    "WaitSettledRequest",
    "WaitSettledResponse",
]

# The longest a daemon holds one wait; a caller wanting longer asks again (the Python client does).
MAX_SETTLED_WAIT = 300.0


class WaitSettledRequest(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "WaitSettledRequest"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    timeout: float = Field(default=30.0, ge=0.0, le=3600.0)  # seconds the daemon may hold the reply


class WaitSettledResponse(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "WaitSettledResponse"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    settled: bool = False
    queued: bool = False  # requests stored and not yet processed
    dvu_pending: bool = False  # a dependent values update is due (with ``settled``: none can run now)
    owned: bool = False  # the change set has a task (a daemon holds it, or it waits for one)
    applied_seq: int = 0  # stream sequence of the last request processed
    error: str | None = None


WAIT_SETTLED_REQUEST = VersionedMessage("WaitSettledRequest", (WaitSettledRequest,), WaitSettledRequest)
WAIT_SETTLED_RESPONSE = VersionedMessage("WaitSettledResponse", (WaitSettledResponse,), WaitSettledResponse)
