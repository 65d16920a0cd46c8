"""The lanes intake of one shard: the workspaces hashed onto a fixed number of lanes, the lanes served in turns.

The tasks stream stores each task under its workspace's lane (``….<wk>.<cs>.<lane>``: the stream's subject
transform, nats-server's ``partition`` of the workspace token, Subjects.tasks_transform), and each lane has one
durable consumer shared by every daemon. So what the servers hold is set by the shards (``LANES`` consumers each),
not by the workspaces, and a newcomer's first task costs one pull, no consumer to make (docs/design.md §7).

Each daemon serves the lanes with tasks in turns, the one waiting longest first, a part of the free slots each: a
flood in one lane does not hold up the others. Inside a lane the tasks come in order; a workspace that owns its room
here (:meth:`LaneIntake._room_for`: all of the daemon's slots but a reserve, at most ``max_owned_per_workspace`` while
other lanes wait) hands the rest of its tasks back with a delay that grows with their deliveries, so the consumer
reaches its lane-mates' tasks behind them, and the flood goes round its own lane slowly meanwhile.

How a daemon knows which lanes have tasks waiting (as the fair intake knows its workspaces'):

- **published**: it subscribes (plain NATS) to the shard's task subjects; a publish puts its lane in line at once.
  The daemon hears a publish as the stream does, so its pull may come before the stream stored the task: a turn's
  pull returns what the lane has, or waits up to :data:`_TURN_WAIT` for the first task if it has none (nats-server's
  no-wait pull with an expiry). Turns run side by side, one per lane at most, their batches counted against the free
  slots while they run, so a pull that waits holds up no other lane;
- **found**: every :data:`_DISCOVER_EVERY` seconds, and at start, it asks each lane's consumer what it has (one
  consumer info per lane: a cost set by the lanes, not by the workspaces);
- **left over**: a turn that took a full batch with more pending puts the lane back in line;
- **handed back**: a task handed back (a retry, a reconnect, a workspace past its room) puts its lane in line once it
  is ready again.

A task held by a daemon that dies comes back when its lease runs out, with nothing published: every lane with tasks
held is *watched* (asked for what is ready, no wait, every half ``ack_wait``) until its consumer says nothing is held
or waiting. What is done with a task taken (owning it, its lease, acking it) is the daemon's (rebaser_server.daemon).
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
from rebaser_core.nats.inline_subscription import subscribe_inline
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

# Each lane's consumer is asked what it has this often (the backstop for a publish not seen).
_DISCOVER_EVERY = 10.0
# A watched lane's consumer is asked for tasks that came back this often (a fraction of ack_wait) ...
_WATCH_SHARE = 0.5
# ... and after this many looks that found nothing, whether it still holds any (else it is no longer watched).
_WATCH_CHECK_AFTER = 4
# Tasks asked for per turn at most (each handed out as it arrives, see puller.py).
_TURN_BATCH = 256
# While every slot is taken and lanes wait, idle change sets are asked to give way at most this often.
_NUDGE_EVERY = 0.05
# One workspace never takes the last 1/_RESERVE of a daemon's slots: a lane-mate or a newcomer finds a slot at once.
_RESERVE = 20
# A pull request is answered within this long (the lease's lower bound is its send time: see lease.py).
_PULL_EXPIRES = 1.0
_RECONNECT_POLL = 0.1
# A handed-back task's lane is put in line this long after the task is due back (each a no-wait pull).
_HANDED_BACK_LOOKS = (0.0, 0.25, 1.0)
# A turn's pull for a publish heard waits this long for a first task when the lane has none (it may not be stored
# yet), then ends ...
_TURN_WAIT = 0.25
# ... and one that took fewer tasks than publishes heard is given again this long after (the rest being stored).
_AGAIN_AFTER = 0.01
# A task of a workspace past its room goes back for this long, doubled with each delivery, at most _DEFER_MAX.
_DEFER = 0.1
_DEFER_MAX = 1.0


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
        self._line: OrderedDict[int, None] = OrderedDict()  # lanes with tasks waiting, oldest first
        self._joined = asyncio.Event()
        self._watched: dict[int, int] = {}  # lane -> looks in a row that found nothing
        self._turning: dict[int, asyncio.Task[None]] = {}  # lane -> its turn, running
        self._looking: set[int] = set()  # lanes the watch pulls now (a lane's pulls share its puller's queue)
        self._again: set[int] = (
            set()
        )  # lanes that joined the line during their turn or look: in line after it
        self._heard: dict[int, int] = {}  # lane -> task publishes heard since its last turn began
        self._rechecks: set[int] = set()  # lanes whose next turn looks again for tasks heard and not found
        self._pullers = [
            TaskPuller(nats.nc, subjects.tasks_stream, subjects.lane_consumer(lane), expires=_PULL_EXPIRES)
            for lane in range(lanes)
        ]
        self._nudged_at = float("-inf")
        self._deferring_until = float("-inf")  # a workspace past its room handed tasks back: press until then
        self.turns = 0
        self.empty_turns = 0
        self.deferred = 0  # tasks handed back because their workspace had its room here

    # -- who waits ----------------------------------------------------------------------------------
    def lane(self, workspace: WorkspacePk) -> int:
        return lane_of(workspace, self._lanes)

    def _join(self, lane: int) -> None:
        if lane in self._turning or lane in self._looking:
            self._again.add(lane)  # its turn may have missed what joined it: another after this one
        elif lane not in self._line:
            self._line[lane] = None
            self._joined.set()

    def handed_back(self, workspace: WorkspacePk, delay: float) -> None:
        """A task of ``workspace`` went back, ready again after ``delay``: its lane joins the line then, and twice
        more a little later (nats-server's redelivery timer may fire after ours)."""
        loop = asyncio.get_running_loop()
        lane = self.lane(workspace)
        for later in _HANDED_BACK_LOOKS:
            loop.call_later(delay + later, self._join, lane)

    def _on_task(self, msg: Msg) -> None:
        """A task was published (handled in nats-py's read loop: a hash of the workspace token, no parsing)."""
        subject = msg.subject
        end = subject.rfind(".", 0, subject.rfind("."))  # the dot before the change set token
        start = subject.rfind(".", 0, end)
        lane = lane_of(subject[start + 1 : end], self._lanes)
        self._heard[lane] = self._heard.get(lane, 0) + 1
        self._join(lane)

    async def _discover(self) -> None:
        """Every lane with tasks waiting joins the line; every lane with tasks held is watched."""
        for lane in range(self._lanes):
            try:
                info = await self._nats.js.consumer_info(
                    self._subjects.tasks_stream, self._subjects.lane_consumer(lane)
                )
            except (TimeoutError, nats.errors.Error) as err:
                log.debug("reading lane %d's consumer failed: %r", lane, err)
                continue
            if info.num_pending:
                self._join(lane)
            if info.num_ack_pending:
                self._watched.setdefault(lane, 0)

    async def _discover_loop(self) -> None:
        while not self._stopping():
            try:
                await self._discover()
            except Exception as err:  # NATS trouble: look again next time
                log.debug("reading the lanes failed: %r", err)
            await asyncio.sleep(_DISCOVER_EVERY)

    # -- the loop -----------------------------------------------------------------------------------
    async def run(self) -> None:
        give_way = self._placement.give_way
        give_way.quiet = FAIR_PRESSURE_QUIET
        give_way.busiest_only = True
        sub = await subscribe_inline(self._nats.nc, self._subjects.tasks_stream_subject, self._on_task)
        background = [
            asyncio.create_task(self._discover_loop(), name=f"lanes intake {self._subjects.shard}: discover"),
            asyncio.create_task(self._watch_loop(), name=f"lanes intake {self._subjects.shard}: watch"),
        ]
        try:
            await self._serve()
        finally:
            give_way.quiet = PRESSURE_QUIET
            give_way.busiest_only = False
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            for puller in self._pullers:
                with contextlib.suppress(Exception):
                    await puller.stop()
                for msg in puller.leftovers():  # delivered, never taken: back at once
                    with contextlib.suppress(Exception):
                        await hand_back(self._nats.nc, msg)

    async def _serve(self) -> None:
        settings, give_way = self._settings, self._placement.give_way
        try:
            while not self._stopping():
                self._joined.clear()  # (before the look: a lane joining from here on wakes _wait)
                unowned = settings.concurrency - len(self._owned)
                free = unowned - self._admission.reserved
                now = time.monotonic()
                if unowned <= 0 or now < self._deferring_until:
                    # Slots are short (every one taken, or a workspace past its room waits for its own): idle change
                    # sets, the busiest workspaces' first, give way at once (quiet.GiveWay). No change set waits for
                    # an idle one.
                    if self._line or self._again or now < self._deferring_until:
                        give_way.press(self._owned.fair.by_workspace, now)
                        self._nudge()
                    else:
                        give_way.ease()
                else:
                    give_way.ease()
                if free <= 0:
                    await self._wait()  # (slots held by running turns come back as each ends)
                    continue
                room = self._admission.room() - self._admission.reserved
                if room <= 0:
                    await self._wait()
                    continue
                if not self._nats.nc.is_connected or self._lapsed():
                    await asyncio.sleep(_RECONNECT_POLL)
                    continue
                if not self._line:
                    await self._wait()
                    continue
                lane, _ = self._line.popitem(last=False)
                self.turns += 1
                batch = min(max(1, free // (1 + len(self._line))), room, _TURN_BATCH)
                heard = self._heard.get(lane, 0)
                if heard:  # what a turn for publishes heard holds while it waits: at most a slot for each
                    batch = min(batch, heard)
                self._admission.reserved += batch
                self._turning[lane] = asyncio.create_task(
                    self._turn(lane, batch), name=f"lanes intake {self._subjects.shard}: lane {lane}"
                )
        finally:
            # Each turn ends within its pull's wait; a task delivered meanwhile is handed back (stopping).
            turns = list(self._turning.values())
            if turns:
                await asyncio.wait(turns, timeout=_TURN_WAIT + _PULL_EXPIRES)
            for turn in turns:
                turn.cancel()
            await asyncio.gather(*turns, return_exceptions=True)

    async def _turn(self, lane: int, batch: int) -> None:
        """Take up to ``batch`` of the tasks ready in ``lane``. A turn for a publish heard waits up to
        :data:`_TURN_WAIT` for the first task (the stream may not have stored it yet); any other takes what is there.
        A turn that took fewer tasks than publishes were heard for its lane gives it another (nats-server ends a
        waiting pull once it delivered what was stored; the rest may be stored a moment later)."""
        heard = self._heard.pop(lane, 0)
        rechecking = lane in self._rechecks
        self._rechecks.discard(lane)
        got = pending = 0
        failed = False
        try:
            wait = _TURN_WAIT if heard else None
            async for msg, pulled_at in self._pullers[lane].pull(batch, no_wait=True, expires=wait):
                got += 1
                if got <= batch:  # (a late delivery of an earlier pull may come too: taken all the same)
                    self._admission.reserved -= 1
                pending = Delivery.of(msg).num_pending
                await self._take(msg, pulled_at)
        except NoConsumer:
            failed = True
            await self._make_consumer(lane)  # deleted by hand, or not made yet: made again
        except Exception as err:
            failed = True
            if not self._stopping():
                log.warning("taking tasks of lane %d failed (%r); trying again", lane, err)
                await asyncio.sleep(_PULL_EXPIRES)
        finally:
            self._admission.reserved -= batch - min(got, batch)
            del self._turning[lane]
            if not got:
                self.empty_turns += 1
            if failed or (got >= batch and pending > 0) or lane in self._again:
                self._again.discard(lane)
                self._join(lane)
            elif got < min(heard, batch) and not rechecking:
                # Fewer than heard (a publish refused since its change set has a task is heard too): looked for
                # once more, waiting again.
                self._heard[lane] = self._heard.get(lane, 0) + min(heard, batch) - got
                self._rechecks.add(lane)
                asyncio.get_running_loop().call_later(_AGAIN_AFTER, self._join, lane)
            if not failed:
                self._watched.setdefault(lane, 0)
            self._joined.set()  # its slots are free again: the loop looks again

    async def _wait(self) -> None:
        """Until a slot frees, a lane joins the line or a turn ends (since the loop's look), or a second passes."""
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
    def _room_for(self, workspace: WorkspacePk) -> int:
        """Change sets ``workspace`` may still take here: all of the daemon's slots but the 1/:data:`_RESERVE` kept
        for the others, and while other lanes wait at most its share (``max_owned_per_workspace``, by default half
        of ``concurrency``, times its weight)."""
        settings, fair = self._settings, self._owned.fair
        owned = fair.by_workspace[workspace]
        room = settings.concurrency - settings.concurrency // _RESERVE - owned
        if self._line:
            weight = dict(settings.workspace_weights).get(str(workspace), 1)
            room = min(room, fair.share * weight - owned)
        return room

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
                "lane %d of shard %d has no consumer, and making it failed (%r)",
                lane,
                self._subjects.shard,
                err,
            )
            await asyncio.sleep(_PULL_EXPIRES)

    async def _take(self, msg: Msg, pulled_at: float) -> None:
        if self._stopping() or len(self._owned) >= self._settings.concurrency:
            # Beyond our free slots (the watch and a turn both took one): straight back for another daemon, and its
            # lane in line again (a task handed back counts as held, not waiting: only the watch would find it).
            with contextlib.suppress(Exception):
                await hand_back(self._nats.nc, msg)
            if not self._stopping():
                with contextlib.suppress(InvalidSubject):
                    self._join(self.lane(self._subjects.parse_task(msg.subject).workspace_id))
            return
        try:
            workspace = self._subjects.parse_task(msg.subject).workspace_id
        except InvalidSubject:
            workspace = None  # the daemon drops it (owned.take)
        if workspace is not None and self._room_for(workspace) <= 0:
            # Its workspace has its room here: back to the lane, tried again after a delay that grows with each
            # delivery, while the lane's other tasks behind it are reached.
            delivered = Delivery.of(msg).delivered
            delay = min(_DEFER * 2 ** min(delivered - 1, 16), _DEFER_MAX)
            self.deferred += 1
            self._deferring_until = time.monotonic() + delay
            with contextlib.suppress(Exception):
                await hand_back(self._nats.nc, msg, delay)
            self.handed_back(workspace, delay)
            return
        await self._owned.take(msg, pulled_at, self._subjects, share_checked=True)

    # -- watching held tasks ------------------------------------------------------------------------
    async def _watch_loop(self) -> None:
        period = _WATCH_SHARE * self._settings.consumer_ack_wait
        while not self._stopping():
            await asyncio.sleep(period)
            for lane in list(self._watched):
                if self._stopping():
                    return
                if lane in self._turning:
                    continue  # its turn takes what came back
                if (
                    len(self._owned) >= self._settings.concurrency
                    or not self._nats.nc.is_connected
                    or self._lapsed()
                ):
                    break  # no slot to take a task that came back into (or none may be taken): the next look
                self._looking.add(lane)
                try:
                    await self._look(lane)
                except Exception as err:
                    log.debug("looking at lane %d's held tasks failed: %r", lane, err)
                finally:
                    self._looking.discard(lane)
                    if lane in self._again:
                        self._again.discard(lane)
                        self._join(lane)

    async def _look(self, lane: int) -> None:
        """Take what came back of ``lane``'s tasks; stop watching it once nothing is held or waiting."""
        free = self._settings.concurrency - len(self._owned)
        batch = max(1, min(free, _TURN_BATCH))
        got = 0
        pending = 0
        try:
            async for msg, pulled_at in self._pullers[lane].pull(batch, no_wait=True):
                got += 1
                pending = Delivery.of(msg).num_pending
                await self._take(msg, pulled_at)
        except NoConsumer:
            self._watched.pop(lane, None)  # nothing of it is held; the next turn makes it again
            return
        if got >= batch and pending > 0:
            self._join(lane)
        if got:
            self._watched[lane] = 0
            return
        self._watched[lane] = looks = self._watched.get(lane, 0) + 1
        if looks < _WATCH_CHECK_AFTER:
            return
        self._watched[lane] = 0
        try:
            info = await self._nats.js.consumer_info(
                self._subjects.tasks_stream, self._subjects.lane_consumer(lane)
            )
        except (TimeoutError, nats.errors.Error):
            return
        if info.num_pending:
            self._join(lane)
        if not info.num_pending and not info.num_ack_pending:
            self._watched.pop(lane, None)

    # -- for /status -------------------------------------------------------------------------------------
    @property
    def waiting(self) -> list[int]:
        """The lanes with tasks waiting, in the order they get their turns."""
        return list(self._line)

    @property
    def watched(self) -> int:
        return len(self._watched)
