"""The fifo intake of one shard: the shard's one shared tasks consumer hands tasks out in the order they came.

Back-pressure starts here: the loop only fetches as many tasks as the daemon has free slots
(``Settings.concurrency``) and room in its cold path (``start_concurrency``, rebaser_server.intake.admission); with
every slot taken it stops pulling, and waiting tasks stay in the stream, not in memory. A full daemon whose owned
change sets idle while others wait for an owner makes them give way (quiet.GiveWay).

While disconnected it does not pull: a pull request sent then would wait in nats-py's reconnect buffer and go out
late, stale. The fair intake (rebaser_server.intake.fair_intake) serves workspaces in turns instead; what is done
with a task taken is the same for both (rebaser_server.daemon.owned).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from rebaser_core.nats import cancellation
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.changeset.owning import Owning
from rebaser_server.intake.admission import Admission
from rebaser_server.intake.owner import Owner
from rebaser_server.intake.puller import TaskPuller
from rebaser_server.ops.health import StatusReporter
from rebaser_server.task.handback import hand_back

__all__ = ["FETCH_TIMEOUT", "FifoIntake", "others_waiting"]

log = logging.getLogger(__name__)

# A pending pull request is answered within this long even when idle, so shutdown never waits longer to stop
# pulling (and never leaves a pull request open that could hand us a task after we stopped).
FETCH_TIMEOUT = 1.0
# Tasks asked for per pull request (at most the free slots). Each is handed out as it arrives (puller.py), so a
# large batch stalls nobody; it only saves round trips when many change sets become active at once.
_FETCH_BATCH = 256
# While disconnected the pull loop looks at the connection this often (nats-py offers nothing to await).
_RECONNECT_POLL = 0.1


class FifoIntake:
    """The pull loop of one daemon; :meth:`run` runs once per served shard."""

    def __init__(
        self,
        owning: Owning,
        owned: Owner,
        admission: Admission,
        *,
        stopping: Callable[[], bool],
        lapsed: Callable[[], bool],
        others_waiting: Callable[[], Awaitable[bool]],
    ) -> None:
        self._owning = owning
        self._owned = owned
        self._admission = admission
        self._stopping = stopping
        self._lapsed = lapsed
        self._others_waiting = others_waiting

    async def run(self, sub: TaskPuller, subjects: Subjects) -> None:
        """Pull the tasks of one shard's consumer (``subjects``) until the daemon stops."""
        settings: Settings = self._owning.settings
        give_way = self._owning.placement.give_way
        while not self._stopping():
            free = settings.concurrency - len(self._owned)
            if free <= 0:
                # Every slot is taken: stop pulling until a change set is released. Meanwhile, if other change sets
                # wait for an owner, say so: owned change sets that are idle then let go early (pressure), so a
                # full daemon cannot keep a newcomer waiting for a whole quiet period (minutes by default); the
                # busiest workspaces' first, so a flood makes room from its own (quiet.GiveWay).
                freed = await self._admission.wait()
                if not freed and await self._others_waiting():
                    give_way.press(self._owned.fair.by_workspace, time.monotonic())
                else:
                    give_way.ease()
                continue
            give_way.ease()
            # Admission: at most start_concurrency change sets in their cold path at once (admission.py).
            room = self._admission.room()
            if room <= 0:
                await self._admission.wait()
                continue
            if not self._owning.nats.nc.is_connected or self._lapsed():
                # A pull request sent now would wait in nats-py's reconnect buffer and go out late, stale; or what
                # it brings would go straight back (the heartbeat lapsed).
                await cancellation.sleep(_RECONNECT_POLL)
                continue
            try:
                # Each delivery comes with the send time of the pull it answers: the server cannot have delivered
                # it before then, which bounds its lease from below (see lease.py).
                async for msg, pulled_at in sub.pull(min(free, room, _FETCH_BATCH)):
                    if self._stopping() or len(self._owned) >= settings.concurrency:
                        # Fetched during shutdown, or beyond our free slots (a late delivery of an earlier pull):
                        # hand it straight back.
                        with contextlib.suppress(Exception):
                            await hand_back(self._owning.nats.nc, msg)
                    else:
                        await self._owned.take(msg, pulled_at, subjects)
            except Exception as err:
                if self._stopping():
                    break
                log.warning("fetching tasks failed (%s); retrying", err)
                await cancellation.sleep(FETCH_TIMEOUT)


async def others_waiting(health: StatusReporter, served: list[int]) -> bool:
    """Do change sets wait for an owner (tasks the shared consumer has not delivered yet) in the ``served`` shards?
    From the health facts, which are cached: at most one consumer-info call a second however often this is asked.
    (Only shards this daemon pulls: in pinned mode another daemon's waiting tasks are not ours to make room for.)"""
    try:
        facts, stale = await health.facts()
    except Exception:
        return False
    if stale:
        return False
    return any(s["tasks_waiting"] for s in facts.shards if s["shard"] in set(served))
