"""``ChangeSetEvent`` v1: what happened to a change set.

The owning daemon decides one event per outcome with the commit that makes the outcome true. The commit's write of
the change set's record carries the change set's last durable events (rebaser_core.api.event_window: the record
feed); with ``events`` on, each event is also published to the ``REBASER_EVENTS`` stream, on
``[P.]rebaser.events.<workspace>.<change_set>``, after that commit (docs/protocol.md §17, docs/events.md). Events
never carry request bodies or values: ids, kinds, counts and times, each field bounded, so an event is always under
:data:`MAX_EVENT_BYTES`.

Two sorts of event:

- **durable** (``applied``, ``conflicts``, ``refused``, ``error_reply``, ``dead_lettered``, ``dvu_finished``):
  committed with the change set's record, numbered ``seq`` = 1, 2, 3, ... per change set without holes, and stored
  in that order, each once (the next owner publishes what a daemon that died left unstored). A follower that sees
  ``seq`` jump knows how many it missed, and drops a repeat by ``seq``.
- **notices** (``taken``, ``released``, ``dvu_started``, ``dvu_failed``; ``paused`` and ``resumed``, said by the
  operator's command or by the owner that paused it after ``max_attempts``): not committed, so only in the events
  stream; ``seq`` is the durable event before it. A crash can lose a notice; it is never repeated.

A change set is *settled* (nothing queued, no DVU due) as of a durable event whose ``settled`` is true: the flag, not
an event of its own, because a change set that is idle between requests (the common case) would otherwise cost a
second message per request.
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from rebaser_core.api.versioned import MessageVersion, VersionedMessage
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk

__all__ = [
    "CHANGE_SET_EVENT",
    "DURABLE_KINDS",
    "MAX_EVENT_BYTES",
    "NOTICE_KINDS",
    "ChangeSetEvent",
    "EventKind",
    "event_msg_id",
    "reason_class",
]

EventKind = Literal[
    "applied",
    "conflicts",
    "refused",
    "error_reply",
    "dead_lettered",
    "dvu_finished",
    "taken",
    "released",
    "dvu_started",
    "dvu_failed",
    "paused",
    "resumed",
]
DURABLE_KINDS: frozenset[str] = frozenset(
    {"applied", "conflicts", "refused", "error_reply", "dead_lettered", "dvu_finished"}
)
NOTICE_KINDS: frozenset[str] = frozenset(
    {"taken", "released", "dvu_started", "dvu_failed", "paused", "resumed"}
)

# Every field below is bounded, so an encoded event stays far under this (checked by the tests); a follower refuses a
# larger one before decoding it.
MAX_EVENT_BYTES = 4096
_SHORT = 128  # owner names, reason classes, error class names
_ADDRESS = 512  # a snapshot address


class ChangeSetEvent(MessageVersion):
    """One thing that happened to one change set. ``id`` is the event's own id (a ULID)."""

    MESSAGE_TYPE: ClassVar[str] = "ChangeSetEvent"
    VERSION: ClassVar[int] = 1

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    kind: EventKind
    # Durable events: 1, 2, 3, ... per change set. A notice: the seq of the durable event before it.
    seq: int = Field(ge=0, le=2**53)
    durable: bool
    at: float = Field(ge=0, le=1e11)  # wall clock, Unix seconds, when the daemon decided it
    # Durable events: nothing was queued behind it and no DVU was due once it was committed.
    settled: bool = False
    owner: str = Field(default="", max_length=_SHORT)  # notices: the owning daemon's name
    epoch: int = Field(default=0, ge=0, le=2**53)  # the ownership: bumped by every takeover
    # Request outcomes.
    request_id: RequestId | None = None
    status: Literal["success", "conflicts", "refused", "error"] | None = None
    updates_performed: int | None = Field(default=None, ge=0, le=2**53)
    snapshot_address: str | None = Field(default=None, max_length=_ADDRESS)
    conflicts: int | None = Field(default=None, ge=0, le=2**53)
    reason: str | None = Field(default=None, max_length=_SHORT)  # dead_lettered: the reason's class
    # Request outcomes: requests already waiting behind it when it was decided (the change set's backlog then).
    queued: int | None = Field(default=None, ge=0, le=2**53)
    # DVU runs.
    duration_s: float | None = Field(default=None, ge=0, le=1e9)
    error: str | None = Field(default=None, max_length=_SHORT)  # dvu_failed: the error's class

    @model_validator(mode="after")
    def _durable_matches_kind(self) -> ChangeSetEvent:
        if self.durable != (self.kind in DURABLE_KINDS):
            raise ValueError(f"a {self.kind} event is {'not ' if self.kind in DURABLE_KINDS else ''}durable")
        return self


CHANGE_SET_EVENT = VersionedMessage("ChangeSetEvent", (ChangeSetEvent,), ChangeSetEvent)


def event_msg_id(workspace_id: WorkspacePk | str, change_set_id: ChangeSetId | str, seq: int) -> str:
    """The ``Nats-Msg-Id`` of durable event ``seq`` of a change set: the same on every publish of it, so a
    republish within the stream's duplicate window is stored once."""
    return f"ev.{workspace_id}.{change_set_id}.{seq}"


# The handler's own words (rebaser_server.changeset.handling); the app's error text follows them.
_GAVE_UP = re.compile(r"^gave up after \d+ attempts: ")
_CRASHED = re.compile(r"^gave up after \d+ attempts: every daemon that took this request died or froze")
_CLASS_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]{0,63}):")


def reason_class(reason: str) -> str:
    """The class of a dead letter's reason (the reason itself may hold text from the request): ``crashed`` (every
    daemon that took it died or froze), ``max_attempts`` (the app failed it that many times), the error's class
    name (``DecodeError``, ``UnprocessableError``, ...) or ``other``."""
    if _GAVE_UP.match(reason):
        return "crashed" if _CRASHED.match(reason) else "max_attempts"
    named = _CLASS_NAME.match(reason)
    return named[1] if named else "other"
