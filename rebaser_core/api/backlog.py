"""``WorkspaceBacklog`` v1 on ``[P.]rebaser.api.backlog.<workspace>.<change_set>``: how many requests a workspace
has queued, and the most it may have (``workspace_max_requests``); see docs/protocol.md §13.

The change set token names any change set of the workspace (the one about to get a request): it keeps the query
subject in the same form as every other, so one permission per workspace (``rebaser.api.*.<wk>.*``) covers it.
A client asks before it publishes (at most once a second per workspace) and refuses a request over the limit with
``RebaserBusy(limit="workspace_requests")``, so that one workspace cannot fill the streams every workspace shares.
"""

from __future__ import annotations

from typing import ClassVar

from rebaser_core.api.versioned import MessageVersion, VersionedMessage
from rebaser_core.ids import ChangeSetId, WorkspacePk

__all__ = [
    "WORKSPACE_BACKLOG_REQUEST",
    "WORKSPACE_BACKLOG_RESPONSE",
    "WorkspaceBacklogRequest",
    "WorkspaceBacklogResponse",
]


class WorkspaceBacklogRequest(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "WorkspaceBacklogRequest"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId


class WorkspaceBacklogResponse(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "WorkspaceBacklogResponse"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    queued: int = 0  # requests of the workspace stored and not yet processed, over every shard
    limit: int = 0  # the most it may have queued (``workspace_max_requests``); 0: no limit
    error: str | None = None


WORKSPACE_BACKLOG_REQUEST = VersionedMessage(
    "WorkspaceBacklogRequest", (WorkspaceBacklogRequest,), WorkspaceBacklogRequest
)
WORKSPACE_BACKLOG_RESPONSE = VersionedMessage(
    "WorkspaceBacklogResponse", (WorkspaceBacklogResponse,), WorkspaceBacklogResponse
)
