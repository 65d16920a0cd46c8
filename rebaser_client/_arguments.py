"""The public methods' arguments, made into what the wire carries: ids from their text, updates from a list or a
stored batch's address, and the enqueue request built from them.

Each public method takes an id as itself or as its text (``"01J..."``, any case); a value that is neither is
:class:`~rebaser_core.errors.InvalidId` naming the argument, never a pydantic error from deeper down.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from rebaser_core.api import EnqueueUpdatesRequest, InlineUpdates, StoredUpdates, Update, UpdatesKind
from rebaser_core.errors import InvalidId
from rebaser_core.ids import ChangeSetId, RequestId, UlidId, WorkspacePk

__all__ = ["Updates", "as_id", "change_set_ids", "enqueue_request", "updates_kind"]

Updates = Sequence[Update] | InlineUpdates | StoredUpdates | str
"""Inline updates (a list, or ``InlineUpdates``), or a stored batch (``StoredUpdates`` or its address)."""

_Id = TypeVar("_Id", bound=UlidId)


def as_id(cls: type[_Id], value: _Id | str, name: str) -> _Id:
    """An id argument as its type: the id itself, or its text converted; anything else is
    :class:`~rebaser_core.errors.InvalidId` naming the argument."""
    if type(value) is cls:
        return value
    try:
        return cls(value)
    except InvalidId as err:
        raise InvalidId(f"{name}: {err}") from None


def change_set_ids(
    workspace_id: WorkspacePk | str, change_set_id: ChangeSetId | str
) -> tuple[WorkspacePk, ChangeSetId]:
    return (
        as_id(WorkspacePk, workspace_id, "workspace_id"),
        as_id(ChangeSetId, change_set_id, "change_set_id"),
    )


def updates_kind(updates: Updates) -> UpdatesKind:
    if isinstance(updates, InlineUpdates | StoredUpdates):
        return updates
    if isinstance(updates, str):
        return StoredUpdates(address=updates)
    return InlineUpdates(updates=list(updates))


def enqueue_request(
    workspace_id: WorkspacePk | str,
    change_set_id: ChangeSetId | str,
    updates: Updates,
    from_change_set_id: ChangeSetId | str | None,
    event_session_id: str | None,
) -> EnqueueUpdatesRequest:
    """A new request (a fresh id) of the enqueue methods' arguments."""
    wk, cs = change_set_ids(workspace_id, change_set_id)
    return EnqueueUpdatesRequest(
        id=RequestId.new(),
        workspace_id=wk,
        change_set_id=cs,
        updates=updates_kind(updates),
        from_change_set_id=(
            None
            if from_change_set_id is None
            else as_id(ChangeSetId, from_change_set_id, "from_change_set_id")
        ),
        event_session_id=event_session_id,
    )
