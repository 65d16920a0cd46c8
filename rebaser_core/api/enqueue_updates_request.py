"""``EnqueueUpdatesRequest``: apply a batch of updates to a change set.

=======  ============================================================================================
v1       ``id, workspace_id, change_set_id, updates_address, from_change_set_id?``
v2       v1 + ``event_session_id?``
v3       ``updates_address`` becomes ``updates``: inline updates, or a stored batch's address (current)
=======  ============================================================================================
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from rebaser_core.api.updates import StoredUpdates, UpdatesKind
from rebaser_core.api.versioned import MessageVersion, VersionedMessage
from rebaser_core.ids import ChangeSetId, WorkspacePk

__all__ = [
    "ENQUEUE_UPDATES_REQUEST",
    "EnqueueUpdatesRequest",
    "EnqueueUpdatesRequestV1",
    "EnqueueUpdatesRequestV2",
    "EnqueueUpdatesRequestV3",
]

EventSessionId = Annotated[str, Field(min_length=1, max_length=64)]


class EnqueueUpdatesRequestV1(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "EnqueueUpdatesRequest"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    updates_address: Annotated[str, Field(min_length=1, max_length=256)]
    from_change_set_id: ChangeSetId | None = None

    def upgrade(self) -> EnqueueUpdatesRequestV2:
        return EnqueueUpdatesRequestV2(**dict(self), event_session_id=None)


class EnqueueUpdatesRequestV2(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "EnqueueUpdatesRequest"
    VERSION: ClassVar[int] = 2

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    updates_address: Annotated[str, Field(min_length=1, max_length=256)]
    from_change_set_id: ChangeSetId | None = None
    event_session_id: EventSessionId | None = None

    def upgrade(self) -> EnqueueUpdatesRequestV3:
        return EnqueueUpdatesRequestV3(
            id=self.id,
            workspace_id=self.workspace_id,
            change_set_id=self.change_set_id,
            updates=StoredUpdates(address=self.updates_address),
            from_change_set_id=self.from_change_set_id,
            event_session_id=self.event_session_id,
        )


class EnqueueUpdatesRequestV3(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "EnqueueUpdatesRequest"
    VERSION: ClassVar[int] = 3

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    updates: UpdatesKind
    from_change_set_id: ChangeSetId | None = None
    event_session_id: EventSessionId | None = None


EnqueueUpdatesRequest = EnqueueUpdatesRequestV3
"""The current version."""

ENQUEUE_UPDATES_REQUEST: VersionedMessage[EnqueueUpdatesRequestV3] = VersionedMessage(
    "EnqueueUpdatesRequest",
    (EnqueueUpdatesRequestV1, EnqueueUpdatesRequestV2, EnqueueUpdatesRequestV3),
    EnqueueUpdatesRequestV3,
)
