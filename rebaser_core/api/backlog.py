"""``WorkspaceBacklog`` on ``[P.]rebaser.api.backlog.<workspace>.<change_set>``: how many requests a workspace has
queued, how many every workspace has (version 2), and the most one workspace may have (``workspace_max_requests``);
see docs/protocol.md §13.

The change set token names any change set of the workspace (the one about to get a request): it keeps the query
subject in the same form as every other, so one permission per workspace (``rebaser.api.*.<wk>.*``) covers it.
A client refuses a request over the limit with ``RebaserBusy(limit="workspace_requests")``, so that one workspace
cannot fill the streams every workspace shares. A query of version 2 is answered in version 2, with
``total_queued``: while every workspace together has less than half the limit queued, no workspace can be near it,
and the client asks nothing per workspace (rebaser_client._backlog).
"""

from __future__ import annotations

from typing import ClassVar

from rebaser_core.api.versioned import MessageVersion, VersionedMessage
from rebaser_core.ids import ChangeSetId, WorkspacePk

__all__ = [
    "WORKSPACE_BACKLOG_REQUEST",
    "WORKSPACE_BACKLOG_RESPONSE",
    "WorkspaceBacklogRequest",
    "WorkspaceBacklogRequestV1",
    "WorkspaceBacklogRequestV2",
    "WorkspaceBacklogResponse",
    "WorkspaceBacklogResponseV1",
    "WorkspaceBacklogResponseV2",
    "backlog_answer_form",
]


class WorkspaceBacklogRequestV1(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "WorkspaceBacklogRequest"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId

    def upgrade(self) -> WorkspaceBacklogRequestV2:
        return WorkspaceBacklogRequestV2(**dict(self))


class WorkspaceBacklogRequestV2(MessageVersion):
    """Version 1; the asker reads a version 2 answer."""

    MESSAGE_TYPE: ClassVar[str] = "WorkspaceBacklogRequest"
    VERSION: ClassVar[int] = 2

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId


class WorkspaceBacklogResponseV1(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "WorkspaceBacklogResponse"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    queued: int = 0  # requests of the workspace stored and not yet processed, over every shard
    limit: int = 0  # the most it may have queued (``workspace_max_requests``); 0: no limit
    error: str | None = None

    def upgrade(self) -> WorkspaceBacklogResponseV2:
        return WorkspaceBacklogResponseV2(**dict(self))


class WorkspaceBacklogResponseV2(MessageVersion):
    """Version 1, and every workspace's queued requests (``total_queued``; None from a version 1 answer)."""

    MESSAGE_TYPE: ClassVar[str] = "WorkspaceBacklogResponse"
    VERSION: ClassVar[int] = 2

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    queued: int = 0  # requests of the workspace stored and not yet processed, over every shard
    limit: int = 0  # the most it may have queued (``workspace_max_requests``); 0: no limit
    # Every workspace's requests stored and not yet processed, over every shard.
    total_queued: int | None = None
    error: str | None = None


WorkspaceBacklogRequest = WorkspaceBacklogRequestV2
"""The current version."""
WorkspaceBacklogResponse = WorkspaceBacklogResponseV2
"""The current version."""


def backlog_answer_form(
    response: WorkspaceBacklogResponseV2, asked_version: int
) -> WorkspaceBacklogResponseV1 | WorkspaceBacklogResponseV2:
    """``response`` in the version of the query it answers (a version 1 asker cannot read version 2)."""
    if asked_version >= WorkspaceBacklogResponseV2.VERSION:
        return response
    return WorkspaceBacklogResponseV1.model_construct(
        **{k: v for k, v in dict(response).items() if k != "total_queued"}
    )


WORKSPACE_BACKLOG_REQUEST: VersionedMessage[WorkspaceBacklogRequestV2] = VersionedMessage(
    "WorkspaceBacklogRequest",
    (WorkspaceBacklogRequestV1, WorkspaceBacklogRequestV2),
    WorkspaceBacklogRequestV2,
)
WORKSPACE_BACKLOG_RESPONSE: VersionedMessage[WorkspaceBacklogResponseV2] = VersionedMessage(
    "WorkspaceBacklogResponse",
    (WorkspaceBacklogResponseV1, WorkspaceBacklogResponseV2),
    WorkspaceBacklogResponseV2,
)
