"""Request/reply queries served by any daemon (core NATS, queue group), outside the serial request stream.

``GetChangeSet`` v1  on ``[P.]rebaser.api.get.<workspace>.<change_set>``:
    a change set's committed values (optionally one path), its snapshot address and whether a DVU is pending.
``ForkChangeSet`` v1 on ``[P.]rebaser.api.fork.<workspace>.<change_set>``:
    create ``change_set`` as a fork of ``from_change_set_id`` at that one's current snapshot.

``GetReply`` v1 (reply v2) on ``[P.]rebaser.api.reply.<workspace>.<change_set>``:
    the reply already given to one request, from the change set's record (``found`` false if the request is not
    processed yet, or so long ago that the record no longer holds its reply). A client whose resend of a request
    was dropped as a duplicate asks this, since the request's own reply may have gone where nobody listens.

Every reply carries ``error`` (a message) instead of a result when the query could not be answered.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import JsonValue

from rebaser_core.api.enqueue_updates_response import RefusedStatus, ResponseStatus, ResponseStatusV1
from rebaser_core.api.updates import AttributePath
from rebaser_core.api.versioned import MessageVersion, VersionedMessage
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk

__all__ = [
    "FORK_CHANGE_SET_REQUEST",
    "FORK_CHANGE_SET_RESPONSE",
    "GET_CHANGE_SET_REQUEST",
    "GET_CHANGE_SET_RESPONSE",
    "GET_REPLY_REQUEST",
    "GET_REPLY_RESPONSE",
    "ForkChangeSetRequest",
    "ForkChangeSetResponse",
    "GetChangeSetRequest",
    "GetChangeSetResponse",
    "GetReplyRequest",
    "GetReplyResponse",
    "GetReplyResponseV1",
    "GetReplyResponseV2",
    "oldest_reply_form",
]


class GetChangeSetRequest(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "GetChangeSetRequest"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    path: AttributePath | None = None


class GetChangeSetResponse(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "GetChangeSetResponse"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    exists: bool = True
    snapshot_address: str | None = None
    dvu_pending: bool = False
    values: dict[str, JsonValue] = {}
    versions: dict[str, str] = {}
    errors: dict[str, str] = {}  # attributes whose value could not be computed, with why
    forked_from: ChangeSetId | None = None
    error: str | None = None

    def value(self, path: str) -> Any:
        return self.values.get(path)


class ForkChangeSetRequest(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "ForkChangeSetRequest"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    from_change_set_id: ChangeSetId


class ForkChangeSetResponse(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "ForkChangeSetResponse"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    snapshot_address: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


GET_CHANGE_SET_REQUEST = VersionedMessage("GetChangeSetRequest", (GetChangeSetRequest,), GetChangeSetRequest)
GET_CHANGE_SET_RESPONSE = VersionedMessage(
    "GetChangeSetResponse", (GetChangeSetResponse,), GetChangeSetResponse
)
FORK_CHANGE_SET_REQUEST = VersionedMessage(
    "ForkChangeSetRequest", (ForkChangeSetRequest,), ForkChangeSetRequest
)
FORK_CHANGE_SET_RESPONSE = VersionedMessage(
    "ForkChangeSetResponse", (ForkChangeSetResponse,), ForkChangeSetResponse
)


class GetReplyRequest(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "GetReplyRequest"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    request_id: RequestId


class GetReplyResponseV1(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "GetReplyResponse"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    request_id: RequestId | None = None  # None only with ``error`` (the query could not be read)
    found: bool = False
    status: ResponseStatusV1 | None = None
    error: str | None = None

    def upgrade(self) -> GetReplyResponseV2:
        return GetReplyResponseV2(**dict(self))


class GetReplyResponseV2(MessageVersion):
    """Version 1, and a recorded ``refused`` status (``EnqueueUpdatesResponse`` v2)."""

    MESSAGE_TYPE: ClassVar[str] = "GetReplyResponse"
    VERSION: ClassVar[int] = 2

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    request_id: RequestId | None = None  # None only with ``error`` (the query could not be read)
    found: bool = False
    status: ResponseStatus | None = None
    error: str | None = None


GetReplyResponse = GetReplyResponseV2
"""The current version."""


def oldest_reply_form(response: GetReplyResponseV2) -> GetReplyResponseV1 | GetReplyResponseV2:
    """``response`` in the oldest version that carries it (version 1 unless it holds a refusal)."""
    if isinstance(response.status, RefusedStatus):
        return response
    return GetReplyResponseV1.model_construct(**dict(response))


GET_REPLY_REQUEST = VersionedMessage("GetReplyRequest", (GetReplyRequest,), GetReplyRequest)
GET_REPLY_RESPONSE: VersionedMessage[GetReplyResponseV2] = VersionedMessage(
    "GetReplyResponse", (GetReplyResponseV1, GetReplyResponseV2), GetReplyResponseV2
)
