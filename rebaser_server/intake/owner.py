"""What the intake reads of the change sets a daemon owns, and how it hands them a task: a small Protocol, so that
the intake never imports the daemon.

The daemon's :class:`rebaser_server.daemon.owned.OwnedChangeSets` satisfies it; a test can hand an intake anything
else that does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from nats.aio.msg import Msg

from rebaser_core.subjects import Subjects
from rebaser_server.intake.fairness import FairShare

__all__ = ["Owner"]


class _Nudged(Protocol):
    def nudge(self, now: float) -> object:
        """Let go now if idle enough, since others wait for a slot (quiet.GiveWay)."""


class Owner(Protocol):
    """The change sets owned now: how many, each workspace's share of them, and taking one more."""

    def __len__(self) -> int: ...

    @property
    def fair(self) -> FairShare:
        """The per-workspace share (rebaser_server.intake.fairness), counted as change sets are taken and end."""

    def processors(self) -> Sequence[_Nudged]:
        """Every owned change set's processor (the fair intake nudges them to give way)."""

    async def take(
        self, msg: Msg, pulled_at: float, subjects: Subjects, *, share_checked: bool = False
    ) -> None:
        """Own the change set of task delivery ``msg``, pulled by a pull request sent at ``pulled_at`` (monotonic).
        ``share_checked``: the intake chose it with the workspace's share in mind."""
