"""What ``rebaser watch`` knows of each change set it follows, from its events alone: who owns it, the last durable
event, the backlog then, whether it is settled and whether a DVU is running. Shown in place on a terminal. No NATS.

Who owns it and whether a DVU runs are told by notices, which only the events stream carries (``--feed stream``):
following the record feed, the line says the ownership's epoch instead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rebaser_core.api import ChangeSetEvent

__all__ = ["ChangeSetView", "WatchState"]

# A workspace watch shows the change sets heard from last, at most this many (a terminal has so many lines).
SHOWN = 12


@dataclass
class ChangeSetView:
    owner: str = ""
    epoch: int = 0
    seq: int = 0
    queued: int | None = None
    settled: bool = False
    dvu_running: bool = False
    owned: bool = False

    def line(self, notices: bool = True) -> str:
        if not notices:  # durable events only: their epoch, not who owns it now
            owner = f"epoch {self.epoch}"
        else:
            owner = f"owned by {self.owner} (epoch {self.epoch})" if self.owned else "not owned"
        queued = "queued ?" if self.queued is None else f"queued {self.queued}"
        state = "settled" if self.settled else "busy"
        dvu = ", DVU running" if self.dvu_running else ""
        return f"{owner}, last #{self.seq}, {queued}, {state}{dvu}"


class WatchState:
    """Each followed change set's view, updated by every event (newest last). ``notices``: the feed carries them
    (the events stream), so the ownership and the DVU runs are known."""

    def __init__(self, notices: bool = True) -> None:
        self.views: dict[str, ChangeSetView] = {}
        self.notices = notices

    def update(self, event: ChangeSetEvent) -> None:
        key = str(event.change_set_id)
        view = self.views.pop(key, None) or ChangeSetView()
        self.views[key] = view  # heard from last: shown last
        view.epoch = max(view.epoch, event.epoch)
        if event.kind == "taken":
            view.owner, view.owned, view.dvu_running = event.owner, True, False
        elif event.kind == "released":
            view.owned, view.dvu_running = False, False
        elif event.kind == "dvu_started":
            view.dvu_running = True
        elif event.kind in ("dvu_finished", "dvu_failed"):
            view.dvu_running = False
        if event.durable:
            view.seq = max(view.seq, event.seq)
            view.settled = event.settled
            if event.queued is not None:
                view.queued = event.queued
            elif event.settled:
                view.queued = 0

    def lines(self, *, workspace: bool) -> list[str]:
        shown = list(self.views.items())[-SHOWN:]
        return [
            f"{key} {view.line(self.notices)}" if workspace else view.line(self.notices)
            for key, view in shown
        ]
