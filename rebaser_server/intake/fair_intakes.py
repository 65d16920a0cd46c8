"""The turn-taking intakes of a daemon's served shards, one each: a
:class:`~rebaser_server.intake.fair_intake.FairIntake` while the layout's intake is fair, a
:class:`~rebaser_server.intake.lane_intake.LaneIntake` while it is lanes; run by the shard's pull loop, and read
together for ``/status``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rebaser_core.ids import WorkspacePk
from rebaser_core.subjects import Subjects
from rebaser_server.changeset.context import Placement
from rebaser_server.intake.fair_intake import FairIntake
from rebaser_server.intake.lane_intake import LaneIntake

__all__ = ["FairIntakes"]


class FairIntakes:
    """The fair intake's loop of every served shard: started by the daemon's pull loop of a shard whose layout's
    intake is fair (``make`` builds one for a shard's names), and read together for ``/status``."""

    def __init__(
        self,
        placement: Placement,
        make: Callable[[Subjects], FairIntake],
        make_lanes: Callable[[Subjects], LaneIntake],
    ) -> None:
        self._placement = placement
        self._make = make
        self._make_lanes = make_lanes
        self._by_shard: dict[int, FairIntake] = {}
        self._lanes_by_shard: dict[int, LaneIntake] = {}

    async def run(self, subjects: Subjects) -> None:
        """Serve shard ``subjects.shard`` with the fair intake until stopped (cancelled, or the daemon stops)."""
        intake = self._make(subjects)
        self._by_shard[subjects.shard] = intake
        try:
            await intake.run()
        finally:
            self._by_shard.pop(subjects.shard, None)

    async def run_lanes(self, subjects: Subjects) -> None:
        """Serve shard ``subjects.shard`` with the lanes intake until stopped."""
        intake = self._make_lanes(subjects)
        self._lanes_by_shard[subjects.shard] = intake
        try:
            await intake.run()
        finally:
            self._lanes_by_shard.pop(subjects.shard, None)

    def of(self, shard: int) -> FairIntake | None:
        """The fair intake serving ``shard`` now, if any."""
        return self._by_shard.get(shard)

    def handed_back(self, shard: int, workspace: WorkspacePk, delay: float) -> None:
        """A task of ``workspace`` in shard ``shard`` went back, ready again after ``delay`` (see
        OwnedChangeSets.on_handed_back)."""
        intake = self._by_shard.get(shard)
        if intake is not None:
            intake.handed_back(workspace, delay)
        lanes = self._lanes_by_shard.get(shard)
        if lanes is not None:
            lanes.handed_back(workspace, delay)

    def status(self) -> dict[str, Any]:
        """The layout's intake (and the one being left while it changes) and, with the fair intake, the workspaces
        waiting for a turn in the order they get it, the workspaces watched, the turns given and the consumers
        made, over the served shards."""
        layout = self._placement.layout
        if layout.intake == "lanes":
            return self._lanes_status()
        intakes = list(self._by_shard.values())
        waiting = [wk for intake in intakes for wk in intake.turns.waiting]
        return {
            "kind": layout.intake,
            "changing_from": layout.intake_from,
            "workspaces_waiting": [str(wk) for wk in waiting[:10]],
            "workspaces_waiting_total": len(waiting),
            "workspaces_watched": sum(intake.watched for intake in intakes),
            "turns": sum(intake.turns.turns for intake in intakes),
            "consumers_created": sum(intake.created_consumers for intake in intakes),
            "workspaces_checking": sum(len(intake.newcomers) for intake in intakes),
            "empty_tasks_dropped": sum(intake.newcomers.empty_tasks_dropped for intake in intakes),
        }

    def _lanes_status(self) -> dict[str, Any]:
        """The lanes intake's: the lanes whose consumer had tasks waiting when last read, the pulls waiting now, the
        pulls made (and those that found nothing) and the tasks handed back for their workspace's room, over the
        served shards."""
        layout = self._placement.layout
        intakes = list(self._lanes_by_shard.values())
        waiting = [
            f"{shard}/{lane}" for shard, intake in self._lanes_by_shard.items() for lane in intake.waiting
        ]
        return {
            "kind": layout.intake,
            "changing_from": layout.intake_from,
            "lanes": layout.lanes,
            "lanes_waiting": waiting[:10],
            "lanes_waiting_total": len(waiting),
            "pulls_waiting": sum(intake.pulling for intake in intakes),
            "pulls": sum(intake.pulls for intake in intakes),
            "empty_pulls": sum(intake.empty_pulls for intake in intakes),
            "tasks_deferred": sum(intake.deferred for intake in intakes),
        }
