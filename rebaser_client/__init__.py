"""rebaser_client: enqueue change-set updates and await their outcome.

.. code-block:: python

    async with await RebaserClient.connect("nats://127.0.0.1:4222") as client:
        response = await client.enqueue_updates_with_reply(workspace, change_set, [SetLiteral(path="/a", value=1)])
"""

from rebaser_client._client import RebaserClient, Updates
from rebaser_client._publisher import ClientStatus
from rebaser_client._spool import SpoolConfig
from rebaser_client._sync import SyncRebaserClient
from rebaser_core.api import (
    ContentType,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    InlineUpdates,
    Remove,
    SetFunction,
    SetLiteral,
    StoredUpdates,
)
from rebaser_core.errors import (
    BatchTooLarge,
    ClientError,
    RebaserBusy,
    RebaserError,
    RebaserRefused,
    RebaserTimeout,
    RebaserUnavailable,
    SpoolError,
    Unsupported,
)
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk

__all__ = [
    "BatchTooLarge",
    "ChangeSetId",
    "ClientError",
    "ClientStatus",
    "ContentType",
    "EnqueueUpdatesRequest",
    "EnqueueUpdatesResponse",
    "InlineUpdates",
    "RebaserBusy",
    "RebaserClient",
    "RebaserError",
    "RebaserRefused",
    "RebaserTimeout",
    "RebaserUnavailable",
    "Remove",
    "RequestId",
    "SetFunction",
    "SetLiteral",
    "SpoolConfig",
    "SpoolError",
    "StoredUpdates",
    "SyncRebaserClient",
    "Unsupported",
    "Updates",
    "WorkspacePk",
]
