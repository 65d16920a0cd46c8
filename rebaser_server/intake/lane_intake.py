"""The lanes intake of one shard: the workspaces hashed onto a fixed number of lanes, each lane pulled on its own.

The tasks stream stores each task under its workspace's lane (``….<wk>.<cs>.<lane>``: the stream's subject
transform, nats-server's ``partition`` of the workspace token, Subjects.tasks_transform), and each lane has one
durable consumer shared by every daemon. So what the servers hold is set by the shards (``LANES`` consumers each),
not by the workspaces, and a newcomer's first task costs no consumer to make (docs/design.md §7).

Each daemon keeps a pull request waiting on every lane while it has free slots, as the fifo intake keeps one on its
shared consumer: nats-server hands a task to a waiting pull the moment it is stored, a task published, handed back or
come back from a dead daemon's lease alike, so nothing has to be heard, looked for or watched. What makes it fair is
how the free slots are split between the lanes' pulls:

- a lane whose last pull found nothing asks for one task and holds no slot for it (a task that finds the daemon full
  goes straight back), so every quiet lane has a pull waiting for a newcomer while the daemon has any free slot, and
  a lone busy workspace has all of them;
- a lane whose last pull was filled takes what it has next, up to twice as many (at most :data:`_MAX_BATCH`), at
  once (no wait), holding that many free slots meanwhile: a busy lane takes slots as fast as it needs them, but only
  as they free, in its turn with the other busy lanes (the lanes without a pull, in the order they ended their last);
- inside a lane the tasks come in order; a workspace that owns its room here (:meth:`LaneIntake._room_for`: all of
  the daemon's slots and cold paths but a reserve, at most ``max_owned_per_workspace`` while another lane has tasks
  waiting) hands its next task back with a delay that grows with its deliveries, and the daemon pulls that lane no
  more for as long: a flood's tasks do not go round and round, and the flood's lane-mates wait behind it (1 in 32).

When every slot is taken and a lane has tasks waiting (as its consumer says, asked at most once a second), or a
workspace's tasks went back for want of room, the busiest workspaces' idle change sets give way at once (50 ms of
quiet, quiet.GiveWay): no change set waits for an idle one. What is done with a task taken (owning it, its lease,
acking it) is the daemon's (rebaser_server.daemon).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

import nats.errors
from nats.aio.msg import Msg

from rebaser_core.errors import InvalidSubject
from rebaser_core.ids import WorkspacePk
from rebaser_core.nats import cancellation
from rebaser_core.nats.streams import lane_tasks_consumer_config
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects, lane_of
from rebaser_server.changeset.context import Nats, Placement
from rebaser_server.changeset.quiet import FAIR_PRESSURE_QUIET, PRESSURE_QUIET
from rebaser_server.intake.admission import Admission
from rebaser_server.intake.owner import Owner
from rebaser_server.intake.puller import NoConsumer, TaskPuller
from rebaser_server.task.delivery import Delivery
from rebaser_server.task.handback import hand_back

__all__ = ["LaneIntake"]

log = logging.getLogger(__name__)

# A busy lane's pull waits this long at most (the lease's lower bound is its send time: see lease.py), then another
# goes ...
_PULL_EXPIRES = 1.0
# ... and a quiet lane's up to this long: on a replicated consumer every waiting pull costs two Raft proposals
# (nats-server tells the followers of it), so 32 lanes' pulls renewed every second cost the servers more than the work.
# But shorter than a lease: a pull's send time is the lower bound of the lease of a task it brings (lease.py), and a
# daemon frozen with pulls waiting would catch its peers' tasks for that long.
_QUIET_EXPIRES = 10.0
# Tasks one pull asks for at most (each handed out as it arrives, see puller.py).
_MAX_BATCH = 256
# While every slot is taken, the lanes' consumers are asked whether tasks wait at most this often ...
_PENDING_EVERY = 1.0
# ... and idle change sets are asked to give way at most this often.
_NUDGE_EVERY = 0.05
# One workspace never takes the last 1/_RESERVE of a daemon's slots: a lane-mate or a newcomer finds a slot at once.
_RESERVE = 20
_RECONNECT_POLL = 0.1
# A task of a workspace past its room goes back for this long, doubled with each delivery, at most _DEFER_MAX.
_DEFER = 0.1
_DEFER_MAX = 1.0
# After a pull that failed (the consumer gone, the connection cut), its lane waits this long before the next.
_RETRY_AFTER = 1.0


def _workspace_of(processor: object) -> object:
    """The workspace of a change set in its cold path (Admission keeps the processors)."""
    return getattr(getattr(processor, "change_set", None), "workspace_id", None)


class LaneIntake:
    def __init__(
        self,
        nats: Nats,
        settings: Settings,
        placement: Placement,
        subjects: Subjects,
        owned: Owner,
        admission: Admission,
        *,
        lanes: int,
        stopping: Callable[[], bool],
        lapsed: Callable[[], bool] = lambda: False,
    ) -> None:
        """``lanes``: the layout's lanes per shard; ``lapsed``: whether tasks must not be taken now (lease_mode
        daemon, the heartbeat lapsed)."""
        self._nats = nats
        self._settings = settings
        self._placement = placement
        self._subjects = subjects
        self._owned = owned
        self._admission = admission
        self._lanes = lanes
        self._stopping = stopping
        self._lapsed = lapsed
        self._quiet_expires = max(
            _PULL_EXPIRES, min(_QUIET_EXPIRES, settings.ack_wait - settings.lease_margin - _PULL_EXPIRES / 2)
        )
        self._pullers = [
            TaskPuller(nats.nc, subjects.tasks_stream, subjects.lane_consumer(lane), expires=_PULL_EXPIRES)
            for lane in range(lanes)
        ]
        # Lanes without a pull, in the order they get their next one (those that ended theirs first).
        self._idle: OrderedDict[int, None] = OrderedDict((lane, None) for lane in range(lanes))
        self._pulling: dict[int, asyncio.Task[None]] = {}
        self._holding: set[int] = set()  # lanes whose pull holds free slots (busy lanes)
        self._want = [1] * lanes  # what each lane's next pull asks for (see the module doc)
        self._paused_until = [
            0.0
        ] * lanes  # a workspace of the lane at its room: the lane is not pulled until then
        self._waiting: dict[int, int] = {}  # lane -> tasks its consumer had waiting, as last read while full
        self._waiting_read_at = float("-inf")
        self._reading: asyncio.Task[None] | None = None
        self._woken = asyncio.Event()
        self._nudged_at = float("-inf")
        self._deferring_until = float("-inf")  # a workspace past its room handed tasks back: press until then
        self._bounced = False  # a task went back since the daemon was last found with a free slot
        self.pulls = 0
        self.empty_pulls = 0
        self.deferred = 0  # tasks handed back because their workspace had its room here

    def lane(self, workspace: WorkspacePk) -> int:
        return lane_of(workspace, self._lanes)

    def handed_back(self, workspace: WorkspacePk, delay: float) -> None:
        """A task of ``workspace`` went back (ready again after ``delay``): a waiting pull of its lane takes it then,
        so nothing is to be done (the fair intake's counterpart puts the workspace in line)."""

    # -- the loop -----------------------------------------------------------------------------------
    async def run(self) -> None:
        give_way = self._placement.give_way
        give_way.quiet = FAIR_PRESSURE_QUIET
        give_way.busiest_only = True
        try:
            await self._serve()
        finally:
            give_way.quiet = PRESSURE_QUIET
            give_way.busiest_only = False
            # A busy lane's pull ends within its expiry; a task delivered meanwhile is handed back (stopping). A quiet
            # lane's is not waited for: a task it would bring is redelivered after ack_wait.
            pulls = list(self._pulling.values())
            busy = [self._pulling[lane] for lane in self._holding]
            if busy:
                await asyncio.wait(busy, timeout=_PULL_EXPIRES + 1.0)
            for pull in pulls:
                pull.cancel()
            if self._reading is not None:
                self._reading.cancel()
            await asyncio.gather(*pulls, *([self._reading] if self._reading else []), return_exceptions=True)
            for puller in self._pullers:
                with contextlib.suppress(Exception):
                    await puller.stop()
                for msg in puller.leftovers():  # delivered, never taken: back at once
                    with contextlib.suppress(Exception):
                        await hand_back(self._nats.nc, msg)

    async def _serve(self) -> None:
        settings = self._settings
        while not self._stopping():
            self._woken.clear()  # (before the look: a pull ending from here on wakes _wait)
            unowned = settings.concurrency - len(self._owned)
            self._press(unowned)
            free = unowned - self._admission.reserved
            room = self._admission.room() - self._admission.reserved
            # The first lane in line that may pull now: a quiet one whenever a slot is free, a busy one if slots are
            # free beyond those its peers hold.
            now = time.monotonic()
            lane = (
                next(
                    (
                        idle
                        for idle in self._idle
                        if self._paused_until[idle] <= now
                        and (self._want[idle] == 1 or (free > 0 and room > 0))
                    ),
                    None,
                )
                if unowned > 0
                else None
            )
            if lane is None:
                await self._wait()
                continue
            if not self._nats.nc.is_connected or self._lapsed():
                # A pull sent now would wait in nats-py's reconnect buffer and go out late, stale; or what it brings
                # would go straight back (the heartbeat lapsed).
                await cancellation.sleep(_RECONNECT_POLL)
                continue
            del self._idle[lane]
            held = 0 if self._want[lane] == 1 else max(1, min(self._want[lane], free, room, _MAX_BATCH))
            self._admission.reserved += held
            self._pulling[lane] = asyncio.create_task(
                self._pull(lane, max(held, 1), held, _PULL_EXPIRES if held else self._quiet_expires),
                name=f"lanes intake {self._subjects.shard}: lane {lane}",
            )

    async def _pull(self, lane: int, batch: int, held: int, expires: float) -> None:
        """One pull of ``lane`` for up to ``batch`` tasks, waiting up to ``expires``, each task taken as it arrives;
        ``held`` of the daemon's free slots count as reserved until their task arrives or the pull ends."""
        got = 0
        retry = deferred = False
        self.pulls += 1
        if held:
            self._holding.add(lane)
        try:
            # A busy lane's pull takes what its lane has now (no wait): it holds its slots no longer than it needs
            # them, and the quiet pull that follows waits for the next task.
            pulls = (
                self._pullers[lane].pull(batch, no_wait=True)
                if held
                else self._pullers[lane].pull(1, expires=expires)
            )
            async for msg, pulled_at in pulls:
                got += 1
                if got <= held:  # (a late delivery of an earlier pull may come too: taken all the same)
                    self._admission.reserved -= 1
                self._waiting[lane] = Delivery.of(msg).num_pending
                deferred = not await self._take(msg, pulled_at, lane) or deferred
        except NoConsumer:
            retry = True
            await self._make_consumer(lane)  # deleted by hand, or not made yet: made again
        except Exception as err:
            retry = True
            if not self._stopping():
                log.warning("pulling tasks of lane %d failed (%r); trying again", lane, err)
        finally:
            self._admission.reserved -= held - min(got, held)
            if deferred:
                self._want[lane] = 1  # (a workspace at its room: no more slots held for this lane for now)
            elif got >= batch:
                self._want[lane] = min(2 * batch, _MAX_BATCH)
            else:
                self._want[lane] = max(1, got)
                self._waiting[lane] = 0  # the pull ended unfilled: nothing was left
            if not got:
                self.empty_pulls += 1
            del self._pulling[lane]
            self._holding.discard(lane)
            if retry and not self._stopping():
                await cancellation.sleep(_RETRY_AFTER)
            self._idle[lane] = None
            self._woken.set()  # its slots are free again: the loop looks again

    async def _wait(self) -> None:
        """Until a slot frees or a pull ends (since the loop's look), or a second passes."""
        woken = asyncio.ensure_future(self._woken.wait())
        freed = asyncio.ensure_future(self._admission.wait())
        try:
            await asyncio.wait({woken, freed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            freed.cancel()

    # -- giving way ---------------------------------------------------------------------------------
    def _press(self, unowned: int) -> None:
        """Who gives way (quiet.GiveWay), as the fair intake decides: every slot taken while another lane's task
        waits, the busiest workspaces' idle change sets at once (50 ms of quiet); while only a workspace's own tasks
        wait for more of its slots (its lane paused for its room, or its own lane's tasks waiting), its idle change
        sets after the fifo intake's quiet (1 s: a flood turns its own slots over as it would alone, rather than
        letting each change set go between two of its requests). Else nothing gives way."""
        give_way, now = self._placement.give_way, time.monotonic()
        if unowned > 0:
            self._bounced = False
        waiting = unowned <= 0 and self._tasks_wait(now)
        others = self._bounced or any(
            n for lane, n in self._waiting.items() if n and self._paused_until[lane] <= now
        )
        if unowned <= 0 and others:
            give_way.quiet = FAIR_PRESSURE_QUIET
            give_way.press(self._owned.fair.by_workspace, now)
            self._nudge(now)
        elif now < self._deferring_until or waiting:
            give_way.quiet = PRESSURE_QUIET
            give_way.press(self._owned.fair.by_workspace, now)
        else:
            give_way.ease()

    def _tasks_wait(self, now: float) -> bool:
        """Whether a lane's consumer had tasks waiting, as last read (read again in the background if older than
        :data:`_PENDING_EVERY`)."""
        if now - self._waiting_read_at >= _PENDING_EVERY and (self._reading is None or self._reading.done()):
            self._waiting_read_at = now
            self._reading = asyncio.create_task(self._read_waiting())
        return any(self._waiting.values())

    async def _read_waiting(self) -> None:
        for lane in range(self._lanes):
            try:
                info = await self._nats.js.consumer_info(
                    self._subjects.tasks_stream, self._subjects.lane_consumer(lane)
                )
            except (TimeoutError, nats.errors.Error) as err:
                log.debug("reading lane %d's consumer failed: %r", lane, err)
                continue
            self._waiting[lane] = info.num_pending
        self._woken.set()

    def _nudge(self, now: float) -> None:
        if now - self._nudged_at < _NUDGE_EVERY:
            return
        self._nudged_at = now
        for processor in self._owned.processors():
            processor.nudge(now)

    # -- taking -------------------------------------------------------------------------------------
    def _room_for(self, workspace: WorkspacePk, lane: int) -> int:
        """Change sets ``workspace`` (of ``lane``) may still take here: all of the daemon's slots but the
        1/:data:`_RESERVE` kept for the others, and while another lane has tasks waiting at most its share
        (``max_owned_per_workspace``, by default half of ``concurrency``, times its weight)."""
        settings, fair = self._settings, self._owned.fair
        owned = fair.by_workspace[workspace]
        room = settings.concurrency - settings.concurrency // _RESERVE - owned
        if (
            self._admission.starting
        ):  # its cold paths too: a flood's activations must not make a newcomer's wait
            starting = self._admission.starting_by(_workspace_of)[workspace]
            starts = settings.start_concurrency - settings.start_concurrency // _RESERVE - starting
            room = min(room, starts)
        weight = dict(settings.workspace_weights).get(str(workspace), 1)
        share = fair.share * weight - owned
        if share < room and self._others_wait(lane):
            room = share
        return room

    def _others_wait(self, lane: int) -> bool:
        self._tasks_wait(time.monotonic())  # (read again in the background if old)
        return any(n for other, n in self._waiting.items() if other != lane)

    async def _take(self, msg: Msg, pulled_at: float, lane: int) -> bool:
        """Own the task's change set, or hand the task back; False if it went back for its workspace's room."""
        settings = self._settings
        if self._stopping() or len(self._owned) >= settings.concurrency:
            # No slot free (a quiet lane's pull holds none; a late delivery of an earlier pull): straight back for
            # another daemon, and meanwhile the busiest idle change sets here give way.
            with contextlib.suppress(Exception):
                await hand_back(self._nats.nc, msg)
            self._bounced = (
                True  # a task waits for a slot: idle change sets give way while the daemon is full
            )
            return True
        try:
            workspace = self._subjects.parse_task(msg.subject).workspace_id
        except InvalidSubject:
            workspace = None  # the daemon drops it (owned.take)
        if workspace is not None and self._room_for(workspace, lane) <= 0:
            # Its workspace has its room here: back to the lane, tried again after a delay that grows with each
            # delivery; meanwhile this daemon pulls the lane no more (each task pulled now would go back too: a
            # flood's thousands would go round and round), and the busiest idle change sets give way.
            delivered = Delivery.of(msg).delivered
            delay = min(_DEFER * 2 ** min(delivered - 1, 16), _DEFER_MAX)
            self.deferred += 1
            now = time.monotonic()
            self._deferring_until = now + delay
            if self._paused_until[lane] < now + delay:
                self._paused_until[lane] = now + delay
                asyncio.get_running_loop().call_later(delay, self._woken.set)
            with contextlib.suppress(Exception):
                await hand_back(self._nats.nc, msg, delay)
            return False
        await self._owned.take(msg, pulled_at, self._subjects, share_checked=True)
        return True

    async def _make_consumer(self, lane: int) -> None:
        layout = self._placement.layout
        if not layout.lane_consumers:
            return  # the intake is changing: its consumers are gone on purpose (rebaser_client.admin.intake)
        config = lane_tasks_consumer_config(
            self._settings, lane, self._subjects.shard, max(layout.streams, 1)
        )
        try:
            await self._nats.js.add_consumer(self._subjects.tasks_stream, config)
            log.warning("lane %d of shard %d had no consumer; made it", lane, self._subjects.shard)
        except Exception as err:
            log.warning(
                "lane %d of shard %d has no consumer; making it failed (%r)", lane, self._subjects.shard, err
            )

    # -- for /status -------------------------------------------------------------------------------------
    @property
    def waiting(self) -> list[int]:
        """The lanes whose consumer had tasks waiting when last read."""
        return [lane for lane, n in self._waiting.items() if n]

    @property
    def pulling(self) -> int:
        return len(self._pulling)
