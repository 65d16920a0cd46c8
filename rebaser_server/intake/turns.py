"""Fair intake: which workspace's tasks a daemon takes next. Pure logic, no NATS.

Every workspace with tasks waiting has a queue of its own (its consumer, rebaser_server.intake.fair_intake), and
the daemon serves the workspaces in turns: the one that has waited longest goes first, whatever another has queued.
A turn takes a part of the free slots: all of them for a workspace alone, else its weight's part of them among the
workspaces waiting (at least one task). A workspace with tasks left after its turn goes to the back of the line.

A workspace that already owns its share of this daemon (``max_owned_per_workspace``) lets the others go first
while they wait; alone it takes every slot.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping

from rebaser_core.ids import WorkspacePk

__all__ = ["WorkspaceTurns"]


class WorkspaceTurns:
    def __init__(self, weights: Iterable[tuple[str, int]] = ()) -> None:
        self._waiting: OrderedDict[WorkspacePk, None] = OrderedDict()  # oldest first
        self._weights: Mapping[str, int] = dict(weights)
        self._total = 0  # the weights of the workspaces waiting
        self.turns = 0  # turns given, for /status

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, workspace: object) -> bool:
        return workspace in self._waiting

    @property
    def waiting(self) -> list[WorkspacePk]:
        """The workspaces with tasks waiting, in the order they get their turns."""
        return list(self._waiting)

    def weight(self, workspace: WorkspacePk) -> int:
        return self._weights.get(str(workspace), 1)

    def wait(self, workspace: WorkspacePk, *, first: bool = False) -> bool:
        """``workspace`` has tasks waiting (a task was published, or found in the stream). It keeps its place if
        it already waits; else it joins the back of the line (``first``: the front, its turn having come while it
        was checked). Whether it joined."""
        if workspace in self._waiting:
            return False
        self._waiting[workspace] = None
        if first:
            self._waiting.move_to_end(workspace, last=False)
        self._total += self.weight(workspace)
        return True

    def forget(self, workspace: WorkspacePk) -> None:
        if workspace in self._waiting:
            del self._waiting[workspace]
            self._total -= self.weight(workspace)

    def next(
        self,
        at_share: Callable[[WorkspacePk], bool],
        eligible: Callable[[WorkspacePk], bool] = lambda _: True,
    ) -> WorkspacePk | None:
        """The workspace whose turn it is, taken out of the line (:meth:`wait` puts it back if tasks are left): the
        first ``eligible`` one that is not ``at_share`` here, or the first eligible one if every one is (nobody
        else could use the slot). None if no workspace waits, or none is eligible (each stays in line)."""
        chosen = first = None
        for workspace in self._waiting:  # in line order, stopping at the first that may have the turn
            if not eligible(workspace):
                continue
            if not at_share(workspace):
                chosen = workspace
                break
            first = first or workspace
        chosen = chosen or first
        if chosen is None:
            return None
        self.forget(chosen)
        self.turns += 1
        return chosen

    def part(self, workspace: WorkspacePk, free: int) -> int:
        """How many tasks ``workspace``'s turn takes of ``free`` slots: all of them if nobody else waits, else its
        weight's part among those waiting (it and the line), at least one."""
        if free <= 0:
            return 0
        if not self._waiting:
            return free
        mine = self.weight(workspace)
        return max(1, free * mine // (mine + self._total))
