"""rebaser_client: enqueue change-set updates and await their outcome.

.. code-block:: python

    async with await RebaserClient.connect("nats://127.0.0.1:4222") as client:
        response = await client.enqueue_updates_with_reply(workspace, change_set, [SetLiteral(path="/a", value=1)])

This package is the library: ``RebaserClient`` and ``SyncRebaserClient``, every type their methods take or return,
and every error they raise (the tree is in :mod:`rebaser_core.errors`). Its modules are private (``_client``,
``_publisher``, ...). The operators' side, the ``rebaser`` command and its reports, is the sub-package
:mod:`rebaser_client.admin`, which the library never imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rebaser_client._arguments import Updates
    from rebaser_client._client import RebaserClient
    from rebaser_client._events import EventStream
    from rebaser_client._pausing import PauseResult, ResumeResult
    from rebaser_client._publisher import ClientStatus
    from rebaser_client._skipping import SkipResult
    from rebaser_client._spool import SpoolConfig
    from rebaser_client._sync import SyncEventStream, SyncRebaserClient
    from rebaser_core.api import (
        ChangeSetEvent,
        ContentType,
        EnqueueUpdatesRequest,
        EnqueueUpdatesResponse,
        ForkChangeSetResponse,
        GetChangeSetResponse,
        InlineUpdates,
        Remove,
        SetFunction,
        SetLiteral,
        StoredUpdates,
        WaitSettledResponse,
        WorkspaceBacklogResponse,
    )
    from rebaser_core.errors import (
        BatchTooLarge,
        ClientError,
        EventsLost,
        HeldByDaemon,
        InvalidId,
        NotFirstInLine,
        NotPaused,
        RebaserBusy,
        RebaserError,
        RebaserRefused,
        RebaserTimeout,
        RebaserUnavailable,
        SpoolError,
        StillHeld,
        Unsupported,
    )
    from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
    from rebaser_core.pauses import Pause

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
    "ForkChangeSetResponse",
    "GetChangeSetResponse",
    "HeldByDaemon",
    "InlineUpdates",
    "InvalidId",
    "NotFirstInLine",
    "NotPaused",
    "Pause",
    "PauseResult",
    "RebaserBusy",
    "RebaserClient",
    "RebaserError",
    "RebaserRefused",
    "RebaserTimeout",
    "RebaserUnavailable",
    "Remove",
    "RequestId",
    "ResumeResult",
    "SetFunction",
    "SetLiteral",
    "SkipResult",
    "SpoolConfig",
    "SpoolError",
    "StillHeld",
    "StoredUpdates",
    "SyncEventStream",
    "SyncRebaserClient",
    "Unsupported",
    "Updates",
    "WaitSettledResponse",
    "WorkspaceBacklogResponse",
    "WorkspacePk",
]

# Each name is imported when first used: the ``rebaser`` command line imports rebaser_client.admin.cli.main, which
# runs this file first, and must not pay for nats-py and pydantic before it knows what it was asked
# (``rebaser --help``).
_WHERE = {
    "ClientStatus": "rebaser_client._publisher",
    "EventStream": "rebaser_client._events",
    "Pause": "rebaser_core.pauses",
    "PauseResult": "rebaser_client._pausing",
    "RebaserClient": "rebaser_client._client",
    "ResumeResult": "rebaser_client._pausing",
    "SkipResult": "rebaser_client._skipping",
    "SpoolConfig": "rebaser_client._spool",
    "SyncEventStream": "rebaser_client._sync",
    "SyncRebaserClient": "rebaser_client._sync",
    "Updates": "rebaser_client._arguments",
    **dict.fromkeys(
        (
            "ChangeSetEvent",
            "ContentType",
            "EnqueueUpdatesRequest",
            "EnqueueUpdatesResponse",
            "ForkChangeSetResponse",
            "GetChangeSetResponse",
            "InlineUpdates",
            "Remove",
            "SetFunction",
            "SetLiteral",
            "StoredUpdates",
            "WaitSettledResponse",
            "WorkspaceBacklogResponse",
        ),
        "rebaser_core.api",
    ),
    **dict.fromkeys(
        (
            "BatchTooLarge",
            "ClientError",
            "EventsLost",
            "HeldByDaemon",
            "InvalidId",
            "NotFirstInLine",
            "NotPaused",
            "RebaserBusy",
            "RebaserError",
            "RebaserRefused",
            "RebaserTimeout",
            "RebaserUnavailable",
            "SpoolError",
            "StillHeld",
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
