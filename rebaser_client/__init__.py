"""rebaser_client: enqueue change-set updates and await their outcome.

.. code-block:: python

    async with await RebaserClient.connect("nats://127.0.0.1:4222") as client:
        response = await client.enqueue_updates_with_reply(workspace, change_set, [SetLiteral(path="/a", value=1)])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rebaser_client._client import RebaserClient, Updates
    from rebaser_client._events import EventStream
    from rebaser_client._publisher import ClientStatus
    from rebaser_client._spool import SpoolConfig
    from rebaser_client._sync import SyncRebaserClient
    from rebaser_core.api import (
        ChangeSetEvent,
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
        EventsLost,
        InvalidId,
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
    "ChangeSetEvent",
    "ChangeSetId",
    "ClientError",
    "ClientStatus",
    "ContentType",
    "EnqueueUpdatesRequest",
    "EnqueueUpdatesResponse",
    "EventStream",
    "EventsLost",
    "InlineUpdates",
    "InvalidId",
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

# Each name is imported when first used: the ``rebaser`` command line imports rebaser_client.cli, which runs this
# file first, and must not pay for nats-py and pydantic before it knows what it was asked (``rebaser --help``).
_WHERE = {
    "ClientStatus": "rebaser_client._publisher",
    "EventStream": "rebaser_client._events",
    "RebaserClient": "rebaser_client._client",
    "SpoolConfig": "rebaser_client._spool",
    "SyncRebaserClient": "rebaser_client._sync",
    "Updates": "rebaser_client._client",
    **dict.fromkeys(
        (
            "ChangeSetEvent",
            "ContentType",
            "EnqueueUpdatesRequest",
            "EnqueueUpdatesResponse",
            "InlineUpdates",
            "Remove",
            "SetFunction",
            "SetLiteral",
            "StoredUpdates",
        ),
        "rebaser_core.api",
    ),
    **dict.fromkeys(
        (
            "BatchTooLarge",
            "ClientError",
            "EventsLost",
            "InvalidId",
            "RebaserBusy",
            "RebaserError",
            "RebaserRefused",
            "RebaserTimeout",
            "RebaserUnavailable",
            "SpoolError",
            "Unsupported",
        ),
        "rebaser_core.errors",
    ),
    **dict.fromkeys(("ChangeSetId", "RequestId", "WorkspacePk"), "rebaser_core.ids"),
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rebaser_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
