"""Paused change sets and workspaces: what a pause says, and where it is kept (the ``REBASER_PAUSES`` KV bucket).

A pause is one key of the bucket: ``cs.<workspace>.<change_set>`` holds a change set, ``ws.<workspace>`` every change
set of a workspace (those created after the pause too). Its value says why, since when and who asked
(:class:`Pause`). Resuming deletes the key. The bucket is file-stored with the deployment's replicas, so a pause
survives daemon restarts, failover and NATS restarts. Every daemon watches it (``rebaser_server.daemon.pauses``);
operators and the client's pausing API write it (``rebaser_client._pausing``). Opening the bucket is NATS plumbing:
:mod:`rebaser_core.nats.pause_store`.

Two causes stand for damage rather than for someone's decision, and each has its repair (:func:`repair_command`):

- ``record_unreadable``: a daemon found the change set's record unreadable and quarantined it, rather than retrying
  it for ever (its requests stay queued; ``rebaser change-set reset-record`` starts it over);
- ``unreadable``: never stored, it is what a key of the bucket that does not hold a pause counts as
  (:meth:`Pause.unreadable`). Fail closed: garbage where a pause was must not silently lift it (at the next daemon
  restart, say); ``rebaser change-set resume`` (or ``workspace resume``) deletes the entry.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Literal

from rebaser_core.errors import DecodeError
from rebaser_core.ids import ChangeSetId, WorkspacePk

__all__ = [
    "MAX_PAUSE_BYTES",
    "PAUSE_CAUSES",
    "Pause",
    "PauseCause",
    "change_set_key",
    "parse_key",
    "repair_command",
    "workspace_key",
]

PauseCause = Literal["operator", "max_attempts", "record_unreadable", "unreadable"]
PAUSE_CAUSES: tuple[PauseCause, ...] = ("operator", "max_attempts", "record_unreadable", "unreadable")

# A pause's value is a few hundred bytes; anything longer in the bucket is not one of ours (an unreadable pause).
MAX_PAUSE_BYTES = 4096
_REASON_MAX = 500
_BY_MAX = 200


@dataclass(frozen=True, slots=True)
class Pause:
    """Why a change set (or a workspace) is paused. ``request_id``: the request that kept failing (cause
    ``max_attempts``), first in line and tried again on resume. ``by``: who asked, when the pause says (the web
    console's caller, say: its token's identity or its peer address); optional, and stored only when known, so an
    entry without it is the same bytes as before and every reader reads both."""

    cause: PauseCause
    reason: str
    since: float  # wall clock, Unix seconds
    request_id: str | None = None
    by: str | None = None

    @classmethod
    def now(
        cls, cause: PauseCause, reason: str, request_id: str | None = None, *, by: str | None = None
    ) -> Pause:
        return cls(cause, reason[:_REASON_MAX], time.time(), request_id, None if by is None else by[:_BY_MAX])

    def encode(self) -> bytes:
        data = asdict(self)
        if data["by"] is None:
            del data["by"]  # the entry of a pause that does not say who: as it always was
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Pause:
        """A stored pause, read as untrusted bytes (``DecodeError`` if it is not one)."""
        if len(data) > MAX_PAUSE_BYTES:
            raise DecodeError(f"pause of {len(data)} bytes, over {MAX_PAUSE_BYTES}")
        try:
            raw = json.loads(data)
            cause, reason, since = raw["cause"], raw["reason"], float(raw["since"])
            request_id, by = raw.get("request_id"), raw.get("by")
        except (ValueError, KeyError, TypeError) as err:
            raise DecodeError(f"not a pause: {err}") from None
        if cause not in PAUSE_CAUSES or not isinstance(reason, str):
            raise DecodeError("not a pause: unknown cause or reason")
        if request_id is not None and not isinstance(request_id, str):
            raise DecodeError("not a pause: request_id")
        if by is not None and not isinstance(by, str):
            raise DecodeError("not a pause: by")
        return cls(cause, reason[:_REASON_MAX], since, request_id, None if by is None else by[:_BY_MAX])

    @classmethod
    def unreadable(cls, err: object, since: float | None = None) -> Pause:
        """What an entry of the bucket that is not a pause counts as: a pause all the same (fail closed), saying
        why it could not be read. ``since``: when the entry was written, if known."""
        reason = f"the pause entry cannot be read ({err}); it holds what it pauses until it is deleted"
        return cls("unreadable", reason[:_REASON_MAX], time.time() if since is None else since)


def repair_command(pause: Pause, workspace_id: object, change_set_id: object | None) -> str | None:
    """The command that repairs the damage ``pause`` stands for; None for a pause that someone decided."""
    if pause.cause == "record_unreadable" and change_set_id is not None:
        return f"rebaser change-set reset-record {workspace_id} {change_set_id}"
    if pause.cause == "unreadable":
        if change_set_id is None:
            return f"rebaser workspace resume {workspace_id}"
        return f"rebaser change-set resume {workspace_id} {change_set_id}"
    return None


def change_set_key(workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
    return f"cs.{workspace_id}.{change_set_id}"


def workspace_key(workspace_id: WorkspacePk) -> str:
    return f"ws.{workspace_id}"


def parse_key(key: str) -> tuple[WorkspacePk, ChangeSetId | None] | None:
    """(workspace, change set or None for a workspace pause) of a pause key; None if it is not one."""
    parts = key.split(".")
    try:
        if len(parts) == 3 and parts[0] == "cs":
            return WorkspacePk(parts[1]), ChangeSetId(parts[2])
        if len(parts) == 2 and parts[0] == "ws":
            return WorkspacePk(parts[1]), None
    except ValueError:
        return None
    return None
