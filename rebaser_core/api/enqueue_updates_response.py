"""``EnqueueUpdatesResponse``: the outcome of one request, sent to its ``X-Reply-Inbox``.

``status`` is one of:

- ``success``: applied; ``updates_performed`` says how many updates, ``snapshot_address`` (if the app has one)
  names the resulting state;
- ``conflicts``: nothing applied, because targets changed since the caller computed the batch;
- ``error``: not applied; ``retryable`` says whether sending the same request again can help.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from rebaser_core.api.versioned import MessageVersion, VersionedMessage
from rebaser_core.ids import ChangeSetId, WorkspacePk

__all__ = [
    "ENQUEUE_UPDATES_RESPONSE",
    "Conflict",
    "ConflictsStatus",
    "EnqueueUpdatesResponse",
    "EnqueueUpdatesResponseV1",
    "ErrorStatus",
    "ResponseStatus",
    "SuccessStatus",
]


class _Status(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class SuccessStatus(_Status):
    kind: Literal["success"] = "success"
    updates_performed: int = Field(ge=0)
    snapshot_address: str | None = None


class Conflict(_Status):
    path: str
    expected_version: str | None
    actual_version: str | None
    message: str = ""


class ConflictsStatus(_Status):
    kind: Literal["conflicts"] = "conflicts"
    conflicts: list[Conflict]


class ErrorStatus(_Status):
    kind: Literal["error"] = "error"
    message: str
    retryable: bool = False


ResponseStatus = Annotated[SuccessStatus | ConflictsStatus | ErrorStatus, Field(discriminator="kind")]


class EnqueueUpdatesResponseV1(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "EnqueueUpdatesResponse"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    status: ResponseStatus

    @property
    def ok(self) -> bool:
        return self.status.kind == "success"


EnqueueUpdatesResponse = EnqueueUpdatesResponseV1
"""The current version."""

ENQUEUE_UPDATES_RESPONSE: VersionedMessage[EnqueueUpdatesResponseV1] = VersionedMessage(
    "EnqueueUpdatesResponse", (EnqueueUpdatesResponseV1,), EnqueueUpdatesResponseV1
)
