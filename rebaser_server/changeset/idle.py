"""When an owned change set lets go on its own: the processor waits here for its outcome, and looks again at the
quiet rule (:mod:`~rebaser_server.changeset.quiet`, pure logic) each time it is woken.

It is woken by the outcome itself, by the end of the request in hand (when the rule said to wait for it), or by
the watchdog and the fair intake (:meth:`IdleWatch.nudge`) once others wait for a slot or the change set's shard
moves away. Never on a fixed tick: with thousands of owned change sets that would be thousands of wake-ups a
second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.context import Placement
from rebaser_server.changeset.dvu_runs import Activity
from rebaser_server.changeset.migration import draining
from rebaser_server.changeset.quiet import look, may_give_way

__all__ = ["IdleWatch"]


class IdleWatch:
    """The quiet rule applied to one owned change set. ``request_lock``: held while a request is handled."""

    def __init__(
        self,
        change_set: ChangeSet,
        names: Subjects,
        *,
        placement: Placement,
        settings: Settings,
        activity: Activity,
        request_lock: asyncio.Lock,
    ) -> None:
        self._change_set, self._names = change_set, names
        self._placement, self._settings = placement, settings
        self._activity, self._request_lock = activity, request_lock
        # Nothing is queued behind the last request handled (set by the processor; no callable back into it: the
        # processor and what it holds are freed by reference counting, without the cycle collector).
        self.caught_up = False
        self._wake: asyncio.Future[None] | None = None  # resolved to make wait() look again
        self._after_request = False  # ... and that when the request in hand ends

    def wake(self) -> None:
        """Make :meth:`wait` look again now (an outcome, or pressure or a drain seen)."""
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def request_ended(self) -> None:
        if self._after_request:
            self.wake()

    def nudge(self, now: float) -> bool:
        """Let go now if this change set is idle enough to give way and its workspace gives way (the watchdog asks at
        every pass; the fair intake asks at once when a workspace waits for a slot of a full daemon). Whether it
        will."""
        if (
            self._wake is not None
            and may_give_way(
                now - self._activity.last,
                caught_up=self.caught_up,
                pressure_quiet=self._placement.give_way.quiet,
            )
            and self.giving_way()
        ):
            self.wake()  # idle long enough to give way: wait() lets it go
            return True
        return False

    def giving_way(self) -> bool:
        """Others wait for a slot (the daemon is full) and this change set's workspace is one that gives way now (the
        busiest first: quiet.GiveWay), or the change set's shard moved (the layout changed, looked at every time: it
        may change while owned): this ownership then only drains the old shard, and lets go once idle so that its
        new shard's task goes on."""
        placement = self._placement
        return placement.give_way.covers(self._change_set.workspace_id) or draining(
            placement.layout, self._change_set, self._names
        )

    async def wait(self, result: asyncio.Future[Any], release: Callable[[str], None]) -> None:
        """Until ``result`` is set: ``release(why)`` once the quiet rule says to let go."""
        settings = self._settings
        while not result.done():
            caught_up = self.caught_up
            step = look(
                time.monotonic() - self._activity.last,
                quiescent_period=settings.quiescent_period,
                nats_timeout=settings.nats_timeout,
                caught_up=caught_up,
                giving_way=caught_up and self.giving_way(),
                request_in_hand=self._request_lock.locked(),
                pressure_quiet=self._placement.give_way.quiet,
            )
            if step.release is not None:
                release(step.release)
                return
            self._after_request = step.after_request
            self._wake = wake = asyncio.get_running_loop().create_future()
            await asyncio.wait({wake}, timeout=step.wait)
            self._wake, self._after_request = None, False
