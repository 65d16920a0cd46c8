"""Reading the event feed from the records' writes for an operator's tools (the console): the window a write
carries, and which of its events are new to a reader of every change set (rebaser_core.api.event_window).

A follower's own stream (``RebaserClient.watch``) is :class:`rebaser_client._events.EventStream`, which also tells
gaps; an operator's page only shows what comes, so here a skipped revision's events are shown with the next one.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping

from nats.aio.msg import Msg

from rebaser_core.api import EVENTS_HEADER, ChangeSetEvent, EventWindow, read_window
from rebaser_core.errors import InvalidSubject, ProtocolError
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.subjects import Subjects

__all__ = ["MAX_TRACKED", "FreshEvents", "window_of_write"]

log = logging.getLogger(__name__)

# Change sets whose last event seen a reader of every change set keeps (the least recently written go first: one
# that comes back shows the last events of its next write's window, at most a window's worth again).
MAX_TRACKED = 65_536


def window_of_write(
    headers: Mapping[str, str] | None, workspace_id: WorkspacePk, change_set_id: ChangeSetId
) -> EventWindow | None:
    """The events a write of the change set's record carries (None: none, or not a window that reads)."""
    value = headers.get(EVENTS_HEADER) if headers else None
    if not value:
        return None
    try:
        return read_window(value, workspace_id, change_set_id)
    except ProtocolError as err:
        log.info("a record write's event window does not read: %s", err)
        return None


class FreshEvents:
    """Of each record write, the events not seen yet: those after the change set's last one seen, or, for a change
    set first seen, those the write decided."""

    def __init__(self, subjects: Subjects) -> None:
        self._subjects = subjects
        self._last: OrderedDict[tuple[WorkspacePk, ChangeSetId], int] = OrderedDict()

    def of(self, msg: Msg) -> list[ChangeSetEvent]:
        try:
            on = self._subjects.parse_record_subject(msg.subject)
        except InvalidSubject:
            return []
        window = window_of_write(msg.headers, on.workspace_id, on.change_set_id)
        if window is None or not window.events:
            return []
        key = (on.workspace_id, on.change_set_id)
        last = self._last.pop(key, None)
        self._last[key] = max(last or 0, window.last_seq)
        while len(self._last) > MAX_TRACKED:
            self._last.popitem(last=False)
        return window.fresh(last, replay=False)
