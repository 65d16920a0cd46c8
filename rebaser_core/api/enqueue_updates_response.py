"""``EnqueueUpdatesResponse``: the outcome of one request, sent to its ``X-Reply-Inbox``.

``status`` is one of:

- ``success``: applied; ``updates_performed`` says how many updates, ``snapshot_address`` (if the app has one)
  names the resulting state;
- ``conflicts``: nothing applied, because targets changed since the caller computed the batch;
- ``error``: not applied; ``retryable`` says whether sending the same request again can help;
- ``refused`` (version 2): not applied, because the application refused it (a validation error such as "quantity
  must be > 0"): ``message`` says why, ``details`` (a JSON object, optional) says it in a form a program reads.
  Sending the same request again gets the same answer; nothing is dead-lettered.

Version 3 adds ``details`` to an ``error`` status the application's code caused: the exception's class and where in
the app it was raised (:class:`ErrorDetails`; never the request's data).

A sender writes the *oldest* version that can carry a reply (:func:`oldest_form`), and never one newer than the
caller reads (the request's ``X-Reply-Version``; version 2 without it): version 1 unless the status is ``refused``
(version 2) or an error with details (version 3, else sent without them). So a client that only knows version 1
keeps working until an application refuses one of its requests.

A status has a bounded size by construction, so a reply always fits in a NATS message and the last
``idempotency_window`` replies fit in the change set's record (unbounded, a 20,000-conflict reply makes every
commit fail): a conflicts status lists at most :data:`MAX_LISTED_CONFLICTS` conflicts and :data:`MAX_STATUS_BYTES` of
them (always the first), and says how many more there were in the last listed conflict's message; an error message
is cut to :data:`MAX_ERROR_MESSAGE_CHARS` characters. :func:`bounded_status` bounds a status tighter still.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ModelWrapValidatorHandler,
    field_validator,
    model_validator,
)

from rebaser_core.api.versioned import MessageVersion, VersionedMessage
from rebaser_core.ids import ChangeSetId, WorkspacePk

__all__ = [
    "ENQUEUE_UPDATES_RESPONSE",
    "Conflict",
    "ConflictsStatus",
    "EnqueueUpdatesResponse",
    "EnqueueUpdatesResponseV1",
    "EnqueueUpdatesResponseV2",
    "EnqueueUpdatesResponseV3",
    "ErrorDetails",
    "ErrorStatus",
    "RefusedStatus",
    "ResponseStatus",
    "ResponseStatusV1",
    "SuccessStatus",
    "bounded_status",
    "oldest_form",
    "reads_up_to",
]

MAX_LISTED_CONFLICTS = 100
MAX_STATUS_BYTES = 16 * 1024
MAX_CONFLICT_MESSAGE_CHARS = 256
MAX_ERROR_MESSAGE_CHARS = 1024
MAX_DETAILS_BYTES = 4 * 1024


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


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

    @field_validator("message")
    @classmethod
    def _short_message(cls, message: str) -> str:
        # Room for the "(and K more ...)" note on top of a cut message (see _listed).
        return _cut(message, 2 * MAX_CONFLICT_MESSAGE_CHARS)


class ConflictsStatus(_Status):
    kind: Literal["conflicts"] = "conflicts"
    conflicts: list[Conflict]

    @model_validator(mode="wrap")
    @classmethod
    def _bounded(cls, data: Any, handler: ModelWrapValidatorHandler[ConflictsStatus]) -> ConflictsStatus:
        status = handler(data)
        listed = _listed(status.conflicts, MAX_STATUS_BYTES)
        return status if listed is status.conflicts else handler({"conflicts": listed})


class ErrorDetails(_Status):
    """What an error the application's code caused was (version 3): the exception's class, and where in the app it
    was raised (``file.py:42 in apply``; None when no frame was the app's). Code locations only, never values."""

    error_class: str = Field(max_length=128)
    raised_at: str | None = Field(default=None, max_length=512)


class ErrorStatus(_Status):
    kind: Literal["error"] = "error"
    message: str
    retryable: bool = False
    # Version 3 only: left out of the encoding when absent, so versions 1 and 2 are written as they always were.
    details: ErrorDetails | None = Field(default=None, exclude_if=lambda value: value is None)

    @field_validator("message")
    @classmethod
    def _short_message(cls, message: str) -> str:
        return _cut(message, MAX_ERROR_MESSAGE_CHARS)


def _json_size(value: JsonValue) -> int:
    return 0 if value is None else len(json.dumps(value, separators=(",", ":")))


class RefusedStatus(_Status):
    """Refused by the application: a mistake in the request, not a fault. Never dead-lettered."""

    kind: Literal["refused"] = "refused"
    message: str
    details: dict[str, JsonValue] | None = None

    @field_validator("message")
    @classmethod
    def _short_message(cls, message: str) -> str:
        return _cut(message, MAX_ERROR_MESSAGE_CHARS)

    @field_validator("details")
    @classmethod
    def _small_details(cls, details: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
        # Bounded like every status, so the reply fits a message and the record's window of replies.
        if _json_size(details) > MAX_DETAILS_BYTES:
            raise ValueError(f"details are over {MAX_DETAILS_BYTES} bytes as JSON")
        return details


_NOTE = re.compile(r"\(and ([0-9]{1,18}) more conflicts not listed\)$")


def _size(conflict: Conflict) -> int:
    """About the encoded size in bytes (JSON or CBOR): the text fields plus room for keys and framing."""
    texts = (conflict.path, conflict.expected_version or "", conflict.actual_version or "", conflict.message)
    return 72 + sum(len(t.encode()) for t in texts)


def _listed(conflicts: list[Conflict], max_bytes: int) -> list[Conflict]:
    """``conflicts`` itself if it is within the bounds, else its longest prefix that is (never empty), the last
    one's message saying how many were left out."""
    total, keep = 0, 0
    for conflict in conflicts[:MAX_LISTED_CONFLICTS]:
        total += _size(conflict)
        if keep and total > max_bytes:
            break
        keep += 1
    if keep == len(conflicts):
        return conflicts
    # Cutting an already cut list (the record keeps a shorter copy) counts what the first cut left out too.
    earlier = _NOTE.search(conflicts[-1].message)
    omitted = len(conflicts) - keep + (int(earlier.group(1)) if earlier else 0)
    last = conflicts[keep - 1]
    note = f"(and {omitted} more conflicts not listed)"
    message = f"{_cut(last.message, MAX_CONFLICT_MESSAGE_CHARS)} {note}".lstrip()
    return [*conflicts[: keep - 1], last.model_copy(update={"message": message})]


def bounded_status(
    status: SuccessStatus | ConflictsStatus | ErrorStatus | RefusedStatus, max_bytes: int
) -> SuccessStatus | ConflictsStatus | ErrorStatus | RefusedStatus:
    """``status`` within about ``max_bytes`` (tighter than the bounds every status has): fewer conflicts listed,
    a shorter error message. The first conflict is always listed."""
    if isinstance(status, ConflictsStatus):
        listed = _listed(status.conflicts, max_bytes)
        return status if listed is status.conflicts else ConflictsStatus(conflicts=listed)
    if (
        isinstance(status, RefusedStatus)
        and _json_size(status.details) + len(status.message.encode()) > max_bytes
    ):
        # The message is what a person reads; the details go first.
        status = status.model_copy(update={"details": None})
    if isinstance(status, ErrorStatus | RefusedStatus) and len(status.message.encode()) > max_bytes:
        # Characters, not bytes, are cut: 4 bytes per character at most.
        return status.model_copy(update={"message": _cut(status.message, max(64, max_bytes // 4))})
    return status


ResponseStatusV1 = Annotated[SuccessStatus | ConflictsStatus | ErrorStatus, Field(discriminator="kind")]
"""The statuses of version 1 replies."""

ResponseStatus = Annotated[
    SuccessStatus | ConflictsStatus | ErrorStatus | RefusedStatus, Field(discriminator="kind")
]
"""The statuses of the current version (version 1's and ``refused``)."""


class EnqueueUpdatesResponseV1(MessageVersion):
    MESSAGE_TYPE: ClassVar[str] = "EnqueueUpdatesResponse"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    status: ResponseStatusV1

    def upgrade(self) -> EnqueueUpdatesResponseV2:
        return EnqueueUpdatesResponseV2(
            id=self.id, workspace_id=self.workspace_id, change_set_id=self.change_set_id, status=self.status
        )


class EnqueueUpdatesResponseV2(MessageVersion):
    """Version 1 and the ``refused`` status."""

    MESSAGE_TYPE: ClassVar[str] = "EnqueueUpdatesResponse"
    VERSION: ClassVar[int] = 2

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    status: ResponseStatus

    @property
    def ok(self) -> bool:
        return self.status.kind == "success"

    def upgrade(self) -> EnqueueUpdatesResponseV3:
        return EnqueueUpdatesResponseV3.model_construct(
            id=self.id, workspace_id=self.workspace_id, change_set_id=self.change_set_id, status=self.status
        )


class EnqueueUpdatesResponseV3(EnqueueUpdatesResponseV2):
    """Version 2 and an error status's ``details``."""

    VERSION: ClassVar[int] = 3

    def upgrade(self) -> EnqueueUpdatesResponseV3:
        raise NotImplementedError("version 3 is the newest")


EnqueueUpdatesResponse = EnqueueUpdatesResponseV3
"""The current version."""

ENQUEUE_UPDATES_RESPONSE: VersionedMessage[EnqueueUpdatesResponseV3] = VersionedMessage(
    "EnqueueUpdatesResponse",
    (EnqueueUpdatesResponseV1, EnqueueUpdatesResponseV2, EnqueueUpdatesResponseV3),
    EnqueueUpdatesResponseV3,
)

# The newest version a caller reads when its request does not say (``X-Reply-Version``): clients before version 3.
READS_WITHOUT_HEADER = 2


def reads_up_to(header: str | None) -> int:
    """The newest reply version a caller reads, from its request's ``X-Reply-Version`` (junk or absent: 2)."""
    if header is None or not header.isdigit() or len(header) > 3:
        return READS_WITHOUT_HEADER
    return max(1, min(int(header), EnqueueUpdatesResponseV3.VERSION))


def oldest_form(
    response: EnqueueUpdatesResponseV2, reads: int = READS_WITHOUT_HEADER
) -> EnqueueUpdatesResponseV1 | EnqueueUpdatesResponseV2 | EnqueueUpdatesResponseV3:
    """``response`` in the oldest version that carries it, and none newer than ``reads`` (an error's details are
    left out for a caller that cannot read them): what a sender writes, so that a peer that only knows version 1
    reads every reply but a refusal."""
    status = response.status
    if isinstance(status, ErrorStatus) and status.details is not None:
        if reads >= EnqueueUpdatesResponseV3.VERSION:
            return EnqueueUpdatesResponseV3.model_construct(
                id=response.id,
                workspace_id=response.workspace_id,
                change_set_id=response.change_set_id,
                status=status,
            )
        status = status.model_copy(update={"details": None})
    if isinstance(status, RefusedStatus):
        return EnqueueUpdatesResponseV2.model_construct(
            id=response.id,
            workspace_id=response.workspace_id,
            change_set_id=response.change_set_id,
            status=status,
        )
    return EnqueueUpdatesResponseV1.model_construct(
        id=response.id,
        workspace_id=response.workspace_id,
        change_set_id=response.change_set_id,
        status=status,
    )
