"""Versioned API messages of the wire contract."""

from rebaser_core.api.change_set_queries import (
    FORK_CHANGE_SET_REQUEST,
    FORK_CHANGE_SET_RESPONSE,
    GET_CHANGE_SET_REQUEST,
    GET_CHANGE_SET_RESPONSE,
    ForkChangeSetRequest,
    ForkChangeSetResponse,
    GetChangeSetRequest,
    GetChangeSetResponse,
)
from rebaser_core.api.codec import ContentType
from rebaser_core.api.enqueue_updates_request import (
    ENQUEUE_UPDATES_REQUEST,
    EnqueueUpdatesRequest,
    EnqueueUpdatesRequestV1,
    EnqueueUpdatesRequestV2,
    EnqueueUpdatesRequestV3,
)
from rebaser_core.api.enqueue_updates_response import (
    ENQUEUE_UPDATES_RESPONSE,
    Conflict,
    ConflictsStatus,
    EnqueueUpdatesResponse,
    EnqueueUpdatesResponseV1,
    ErrorStatus,
    ResponseStatus,
    SuccessStatus,
)
from rebaser_core.api.updates import (
    AttributePath,
    InlineUpdates,
    Remove,
    SetFunction,
    SetLiteral,
    StoredUpdates,
    Update,
    UpdatesKind,
)
from rebaser_core.api.versioned import MessageVersion, Negotiated, VersionedMessage

__all__ = [
    "ENQUEUE_UPDATES_REQUEST",
    "ENQUEUE_UPDATES_RESPONSE",
    "FORK_CHANGE_SET_REQUEST",
    "FORK_CHANGE_SET_RESPONSE",
    "GET_CHANGE_SET_REQUEST",
    "GET_CHANGE_SET_RESPONSE",
    "AttributePath",
    "Conflict",
    "ConflictsStatus",
    "ContentType",
    "EnqueueUpdatesRequest",
    "EnqueueUpdatesRequestV1",
    "EnqueueUpdatesRequestV2",
    "EnqueueUpdatesRequestV3",
    "EnqueueUpdatesResponse",
    "EnqueueUpdatesResponseV1",
    "ErrorStatus",
    "ForkChangeSetRequest",
    "ForkChangeSetResponse",
    "GetChangeSetRequest",
    "GetChangeSetResponse",
    "InlineUpdates",
    "MessageVersion",
    "Negotiated",
    "Remove",
    "ResponseStatus",
    "SetFunction",
    "SetLiteral",
    "StoredUpdates",
    "SuccessStatus",
    "Update",
    "UpdatesKind",
    "VersionedMessage",
]
