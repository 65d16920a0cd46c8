"""The fair intake of one shard: every workspace's tasks in a queue of their own, the workspaces served in turns.

With the fifo intake one consumer per shard hands tasks out in the order they came, so a newcomer's first task
waits behind a flood's thousands. Here each workspace with tasks has a durable consumer of its own on the shard's
tasks stream (filter ``rebaser.tasks.<wk>.*.process``; a work-queue stream accepts several consumers whose filters do
not overlap), shared by every daemon, and each daemon takes tasks from the workspaces in turns
(rebaser_server.intake.turns): the one waiting longest first, a part of the free slots each. How a daemon knows
which workspaces have tasks waiting (a task's publish heard, the stream's subjects read, a turn's last delivery, a
task handed back) is :mod:`~rebaser_server.intake.fair_line`, the base of :class:`FairIntake`.

A workspace this daemon knows no consumer of is checked for work when its turn comes, off the turn loop
(rebaser_server.intake.newcomers): a workspace with only made-up tasks gets no consumer and no turn, and its tasks
are dropped.

A task a daemon holds can come back (its holder died or lost its lease) with nobody asking for it: nothing is
published, and the workspace's queue is empty until the lease runs out. So every workspace whose tasks may be held
is *watched*: its consumer is asked for what is ready (no wait) every :data:`_WATCH_EVERY` seconds, until its
consumer says nothing is left (no task waiting, none held). A dead daemon's change sets are then served again
within ``ack_wait`` plus one look.

The tasks themselves, their leases, and what the daemon does with one are those of the fifo intake
(rebaser_server.daemon.owned): only the order in which they are taken changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping

import nats.errors
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from rebaser_core.ids import WorkspacePk
from rebaser_core.nats import cancellation
from rebaser_core.nats.inline_subscription import subscribe_inline
from rebaser_core.nats.streams import WORKSPACE_CONSUMER_IDLE
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.changeset.context import Nats, Placement
from rebaser_server.changeset.quiet import FAIR_PRESSURE_QUIET, PRESSURE_QUIET, busiest
from rebaser_server.intake.admission import Admission
from rebaser_server.intake.fair_line import FairLine
from rebaser_server.intake.newcomers import Newcomers
from rebaser_server.intake.owner import Owner
from rebaser_server.intake.puller import NoConsumer, TaskPuller
from rebaser_server.intake.turns import WorkspaceTurns
from rebaser_server.intake.workspace_consumers import create_workspace_consumer
from rebaser_server.task.delivery import Delivery
from rebaser_server.task.handback import hand_back

__all__ = ["FairIntake"]

log = logging.getLogger(__name__)

# A watched workspace's consumer is asked for tasks that came back this often (a fraction of ack_wait).
_WATCH_SHARE = 0.5
# ... and after this many looks that found nothing, whether it still holds any (else it is no longer watched).
_WATCH_CHECK_AFTER = 4
# Tasks asked for per turn at most (each handed out as it arrives, see puller.py).
_TURN_BATCH = 256
# While every slot is taken and workspaces wait, idle change sets are asked to give way at most this often.
_NUDGE_EVERY = 0.05
# One workspace never takes the last 1/_RESERVE of a daemon's slots (5 % at concurrency 500: 25 slots): a newcomer
# finds a slot at once, not after an idle change set has given way (50 ms of quiet and a release).
_RESERVE = 20
# A pull request is answered within this long (the lease's lower bound is its send time: see lease.py).
_PULL_EXPIRES = 1.0
_RECONNECT_POLL = 0.1


def _workspace_of(processor: object) -> object:
    """The workspace of a change set in its cold path (Admission keeps the processors)."""
    return getattr(getattr(processor, "change_set", None), "workspace_id", None)


class FairIntake(FairLine):
    def __init__(
        self,
        nats: Nats,
        settings: Settings,
        placement: Placement,
        subjects: Subjects,
        owned: Owner,
        admission: Admission,
        *,
        stopping: Callable[[], bool],
        lapsed: Callable[[], bool] = lambda: False,
    ) -> None:
        """``lapsed``: whether tasks must not be taken now (lease_mode daemon, the heartbeat lapsed)."""
        self._nats = nats
        self._settings = settings
        self._placement = placement
        self._subjects = subjects
        self._owned = owned
        self._admission = admission
        self._stopping = stopping
        self._lapsed = lapsed
        self.turns = WorkspaceTurns(settings.workspace_weights)
        self._watched: dict[WorkspacePk, int] = {}  # workspace -> looks in a row that found nothing
        self._pullers: dict[WorkspacePk, TaskPuller] = {}
        self._dropped_pullers: set[asyncio.Task[None]] = set()  # stopping (their given-up pulls unsubscribed)
        self._joined = asyncio.Event()  # a workspace joined the line
        # The workspace of a task subject's head (up to its workspace token), as published tasks are seen.
        self._seen: dict[str, WorkspacePk] = {}
        # Workspaces whose task's publish was heard and not found yet: the looks left (_FRESH_LOOKS).
        self._fresh: dict[WorkspacePk, int] = {}
        self.fresh_looks = 0  # turns given again for a publish heard before the stream had it, for /status
        self.empty_turns = 0  # turns that found nothing ready
        self._nudged_at = float("-inf")
        self.created_consumers = 0
        # The workspaces whose consumer this daemon made or pulled from, and when it last did; any other is checked
        # first. One idle for longer than its consumer lives is forgotten (_forget_idle): workspaces come and go for
        # as long as the daemon runs.
        self._known: dict[WorkspacePk, float] = {}
        self.newcomers = Newcomers(
            nats,
            settings,
            placement,
            subjects,
            make_consumer=self._create_consumer,
            ready=self._ready,
            again=self._join,
        )

    # -- the loop -----------------------------------------------------------------------------------
    async def run(self) -> None:
        nc = self._nats.nc
        self._placement.give_way.quiet = FAIR_PRESSURE_QUIET
        self._placement.give_way.busiest_only = True
        sub = await subscribe_inline(nc, self._subjects.tasks_stream_subject, self._on_task)
        background = [
            asyncio.create_task(self._discover_loop(), name=f"fair intake {self._subjects.shard}: discover"),
            asyncio.create_task(self._watch_loop(), name=f"fair intake {self._subjects.shard}: watch"),
            asyncio.create_task(self.newcomers.run(), name=f"fair intake {self._subjects.shard}: newcomers"),
        ]
        try:
            await self._serve()
        finally:
            # The intake may change to fifo (rebaser streams intake): its give way is the fifo one again.
            self._placement.give_way.quiet = PRESSURE_QUIET
            self._placement.give_way.busiest_only = False
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            for puller in self._pullers.values():
                with contextlib.suppress(Exception):
                    await puller.stop()

    async def _serve(self) -> None:
        settings, give_way = self._settings, self._placement.give_way
        while not self._stopping():
            free = settings.concurrency - len(self._owned)
            if free <= 0:
                # Every slot taken: while workspaces wait, idle change sets (the busiest workspaces' first) give way
                # at once, so a newcomer does not wait a quiet period for a slot (quiet.GiveWay).
                owned = self._owned.fair.by_workspace
                if self._newcomer_waits(owned):
                    give_way.quiet = FAIR_PRESSURE_QUIET
                    give_way.press(owned, time.monotonic())
                    self._nudge()
                elif self.turns:
                    # Only the busiest wait for more of their own slots: their idle change sets give way after the
                    # fifo intake's quiet (a flood turns its own slots over as it would alone), found by the watchdog.
                    give_way.quiet = PRESSURE_QUIET
                    give_way.press(owned, time.monotonic())
                else:
                    give_way.ease()
                await self._wait()
                continue
            give_way.ease()
            room = self._admission.room()
            if room <= 0:
                await self._wait()
                continue
            if not self._nats.nc.is_connected or self._lapsed():
                await cancellation.sleep(_RECONNECT_POLL)
                continue
            # Counted once a turn (at most start_concurrency change sets): each workspace's cold paths.
            starting = self._admission.starting_by(_workspace_of)
            workspace = self.turns.next(self._at_share, eligible=functools.partial(self._has_room, starting))
            if workspace is None:
                await self._wait()
                continue
            if workspace not in self._known:
                self.newcomers.check(workspace)  # its turn again once it is known to have work (newcomers.py)
                await cancellation.sleep(
                    0
                )  # (a line of thousands of made-up workspaces must not hold the loop)
                continue
            room_for = self._room_for(workspace, starting[workspace])
            batch = min(self.turns.part(workspace, free), room, _TURN_BATCH, room_for)
            try:
                more = await self._take_from(workspace, batch)
            except Exception as err:
                if self._stopping():
                    break
                log.warning("taking tasks of workspace %s failed (%r); trying again", workspace, err)
                self._join(workspace)
                await cancellation.sleep(_PULL_EXPIRES)
                continue
            if more:
                self._join(workspace)
            elif workspace in self._known:
                self._watched.setdefault(workspace, 0)

    def _newcomer_waits(self, owned: Mapping[WorkspacePk, int]) -> bool:
        """Whether a workspace waits that is not among the busiest here: idle change sets of the busiest then give
        way at once (FAIR_PRESSURE_QUIET)."""
        if not self.turns:
            return False
        first = busiest(owned)
        return any(workspace not in first for workspace in self.turns.waiting)

    def _room_for(self, workspace: WorkspacePk, starting: int) -> int:
        """Tasks ``workspace`` may take (``starting``: its change sets in their cold path): all but the
        :data:`_RESERVE` part of the daemon kept for the others, of its slots and of its cold paths
        (``start_concurrency``: a flood's activations must not make a newcomer's wait for theirs)."""
        settings = self._settings
        slots = (
            settings.concurrency - settings.concurrency // _RESERVE - self._owned.fair.by_workspace[workspace]
        )
        starts = settings.start_concurrency - settings.start_concurrency // _RESERVE - starting
        return min(slots, starts)

    def _has_room(self, starting: Mapping[object, int], workspace: WorkspacePk) -> bool:
        return self._room_for(workspace, starting.get(workspace, 0)) > 0

    def _at_share(self, workspace: WorkspacePk) -> bool:
        fair = self._owned.fair
        return fair.by_workspace[workspace] >= fair.share * self.turns.weight(workspace)

    async def _wait(self) -> None:
        """Until a slot frees, a workspace joins the line, or a second passes."""
        self._joined.clear()
        joined = asyncio.ensure_future(self._joined.wait())
        freed = asyncio.ensure_future(self._admission.wait())
        try:
            await asyncio.wait({joined, freed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            joined.cancel()
            freed.cancel()

    def _nudge(self) -> None:
        now = time.monotonic()
        if now - self._nudged_at < _NUDGE_EVERY:
            return
        self._nudged_at = now
        for processor in self._owned.processors():
            processor.nudge(now)

    # -- taking -------------------------------------------------------------------------------------
    def _puller(self, workspace: WorkspacePk) -> TaskPuller:
        puller = self._pullers.get(workspace)
        if puller is None:
            consumer = self._subjects.workspace_tasks_consumer(workspace)
            puller = TaskPuller(self._nats.nc, self._subjects.tasks_stream, consumer, expires=_PULL_EXPIRES)
            self._pullers[workspace] = puller
        return puller

    async def _take_from(self, workspace: WorkspacePk, batch: int) -> bool:
        """Take up to ``batch`` tasks of ``workspace`` that are ready now; whether more are ready. A workspace
        whose consumer is gone (idle for its inactive_threshold) is checked again as a newcomer."""
        try:
            got, more = await self._pull_ready(workspace, batch)
        except NoConsumer:
            self._known.pop(workspace, None)
            self._drop_puller(workspace)
            self.newcomers.check(workspace)
            return False
        self._found(workspace, got)
        return more

    async def _create_consumer(self, workspace: WorkspacePk) -> None:
        layout = self._placement.layout
        await create_workspace_consumer(
            self._nats, self._settings, self._subjects, workspace, max(layout.streams, 1)
        )
        self.created_consumers += 1

    async def _pull_ready(self, workspace: WorkspacePk, batch: int) -> tuple[int, bool]:
        """Take what ``workspace``'s consumer has ready now, up to ``batch``: how many, and whether more wait (a
        full batch whose last delivery says more are pending)."""
        got, pending = 0, 0
        if workspace in self._known:
            self._known[workspace] = time.monotonic()
        async for msg, pulled_at in self._puller(workspace).pull(batch, no_wait=True):
            got += 1
            pending = Delivery.of(msg).num_pending
            await self._take(msg, pulled_at)
        return got, got >= batch and pending > 0

    async def _take(self, msg: Msg, pulled_at: float) -> None:
        if self._stopping() or len(self._owned) >= self._settings.concurrency:
            # Beyond our free slots (the watch and a turn both took one): straight back for another daemon.
            with contextlib.suppress(Exception):
                await hand_back(self._nats.nc, msg)
            return
        await self._owned.take(msg, pulled_at, self._subjects, share_checked=True)

    # -- watching held tasks ------------------------------------------------------------------------
    async def _watch_loop(self) -> None:
        period = _WATCH_SHARE * self._settings.consumer_ack_wait
        while not self._stopping():
            await cancellation.sleep(period)
            self._forget_idle(time.monotonic())
            for workspace in list(self._watched):
                if self._stopping():
                    return
                if (
                    len(self._owned) >= self._settings.concurrency
                    or not self._nats.nc.is_connected
                    or self._lapsed()
                ):
                    break  # no slot to take a task that came back into (or none may be taken): the next look
                try:
                    await self._look(workspace)
                except Exception as err:
                    log.debug("looking at workspace %s's held tasks failed: %r", workspace, err)

    async def _look(self, workspace: WorkspacePk) -> None:
        """Take what came back of ``workspace``'s tasks; stop watching it once nothing is left."""
        free = self._settings.concurrency - len(self._owned)
        try:
            got, more = await self._pull_ready(workspace, max(1, min(free, _TURN_BATCH)))
        except NoConsumer:
            self._known.pop(workspace, None)
            self._unwatch(workspace)  # deleted after being idle: nothing of it was held
            return
        if more:
            self._join(workspace)
        if got:
            self._watched[workspace] = 0
            return
        self._watched[workspace] = looks = self._watched.get(workspace, 0) + 1
        if looks < _WATCH_CHECK_AFTER:
            return
        self._watched[workspace] = 0
        try:
            info = await self._nats.js.consumer_info(
                self._subjects.tasks_stream, self._subjects.workspace_tasks_consumer(workspace)
            )
        except NotFoundError:
            self._known.pop(workspace, None)
            self._unwatch(workspace)
            return
        except (TimeoutError, nats.errors.Error):
            return
        if info.num_pending:
            self._join(workspace)
        if not info.num_pending and not info.num_ack_pending:
            self._unwatch(workspace)

    def _forget_idle(self, now: float) -> None:
        """Forget the workspaces not pulled from for longer than their consumer outlives its last pull: it is gone
        (or going), so the next task of one is a newcomer's anyway."""
        for workspace, at in list(self._known.items()):
            if (
                now - at > WORKSPACE_CONSUMER_IDLE
                and workspace not in self._watched
                and workspace not in self.turns
            ):
                del self._known[workspace]
                self._drop_puller(workspace)

    def _unwatch(self, workspace: WorkspacePk) -> None:
        self._watched.pop(workspace, None)
        if workspace not in self.turns:
            self._drop_puller(workspace)

    def _drop_puller(self, workspace: WorkspacePk) -> None:
        """Forget ``workspace``'s puller (one per workspace pulled from would otherwise stay for as long as the daemon
        runs). Its pulls given up locally are unsubscribed in the background; a turn pulling with it now finishes
        (a pull's own subscription ends with the pull)."""
        puller = self._pullers.pop(workspace, None)
        if puller is not None:
            task = asyncio.create_task(puller.stop())
            self._dropped_pullers.add(task)
            task.add_done_callback(self._dropped_pullers.discard)

    @property
    def watched(self) -> int:
        return len(self._watched)
