"""The daemon: take tasks through its intake, run one processor per owned change set, shut down cleanly.

Tasks come in through one intake per served shard (rebaser_server.intake): in order (fifo_intake.py), or by workspace
in turns (fair_intake.py); either takes only as many as the daemon has free slots, so waiting tasks stay in the
stream, not in memory. A NATS outage is survived in place: the intakes wait for the connection instead of queueing
pull requests into nats-py's reconnect buffer, and after every reconnect the daemon re-ensures its streams, hands its
owned change sets back and sweeps for orphaned requests at once (reconnect.py).

What a daemon shows of itself (the properties ``/status``, ``/metrics`` and tests read) is its base,
:class:`~rebaser_server.daemon.readouts.DaemonReadouts`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

from nats.aio.client import Client as NatsClient

from rebaser_core.errors import DurabilityTooLow
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats import speedups as nats_speedups
from rebaser_core.nats.durability import meets
from rebaser_core.nats.requester import Requester
from rebaser_core.pauses import Pause
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.app import RebaserApp
from rebaser_server.app.calls import capabilities
from rebaser_server.changeset.context import Nats, Placement, Report, Stats
from rebaser_server.changeset.hooks import Hooks
from rebaser_server.changeset.owning import Owning
from rebaser_server.changeset.replies import Replies
from rebaser_server.daemon.liveness import Liveness
from rebaser_server.daemon.owned import OwnedChangeSets
from rebaser_server.daemon.pauses import PauseWatcher
from rebaser_server.daemon.readouts import DaemonReadouts
from rebaser_server.daemon.reconnect import recover_after_reconnect
from rebaser_server.daemon.shards import ShardPullers
from rebaser_server.daemon.startup import set_up_with_retries, start_app, stop_task
from rebaser_server.daemon.sweeper import Sweeper
from rebaser_server.intake.admission import Admission
from rebaser_server.intake.fair_intake import FairIntake
from rebaser_server.intake.fair_intakes import FairIntakes
from rebaser_server.intake.fifo_intake import FETCH_TIMEOUT, FifoIntake, others_waiting
from rebaser_server.intake.lane_intake import LaneIntake
from rebaser_server.intake.puller import TaskPuller
from rebaser_server.ops.durability import DurabilityCheck, durable_streams
from rebaser_server.ops.health import ConnectionWatch, StatusReporter
from rebaser_server.ops.observe import Observer
from rebaser_server.ops.status import status_of
from rebaser_server.queries.service import QueryService
from rebaser_server.record.direct_reads import DirectReads
from rebaser_server.record.reader import StoreReader
from rebaser_server.record.store import ChangeSetStore
from rebaser_server.task.keeper import LeaseKeeper

__all__ = ["Daemon"]

log = logging.getLogger(__name__)

# lease_mode daemon: how often the watchdog looks at each idle change set (LeaseKeeper's watch_every). A task's own
# lease runs minutes there; a step overrunning handler_deadline (minutes) is found a second or two later.
_DAEMON_LEASES_WATCH = 2.0


class Daemon(DaemonReadouts):
    """One rebaser daemon on an open NATS connection.

    ``await daemon.start()`` sets up streams, the tasks consumer, the change-set store and the app, then pulls
    tasks in the background; ``await daemon.shutdown()`` hands every owned change set back and stops.
    """

    def __init__(
        self,
        nc: NatsClient,
        settings: Settings,
        app: RebaserApp,
        *,
        owner: str | None = None,
        hooks: Hooks | None = None,
        sweep: bool = True,
    ) -> None:
        nats_speedups.install(nc)  # every request delivery, reply and commit carries headers
        js = nc.jetstream(timeout=settings.nats_timeout)
        owner = owner or f"{socket.gethostname()}:{os.getpid()}:{RequestId.new()}"
        requester = Requester(nc)
        store = ChangeSetStore(js, settings, requester)
        stats = Stats()
        report = Report(stats, Observer(), hooks or Hooks())
        # Shard 0's names and the shared ones, made once: Settings.subjects builds (and validates) new ones.
        subjects = settings.subjects
        placement = Placement()

        def renewed() -> None:
            stats.lease_renewals += 1

        nats = Nats(nc, js, requester, store.reads or DirectReads(requester, settings.nats_timeout))
        replies = Replies(nc, settings, subjects, stats, report.observe)
        daemon_leases = settings.lease_mode == "daemon"

        def urgent() -> bool:
            # Watch every owned change set on every pass: the heartbeat lapsed (each must stop at once), others
            # wait for a slot or a shard drains (idle ones give way).
            heartbeat = None if self.liveness is None else self.liveness.heartbeat
            layout = placement.layout
            return (
                placement.pressure
                or layout.previous is not None
                or (heartbeat is not None and not heartbeat.held())
            )

        keeper = LeaseKeeper(
            nc,
            period=settings.progress_period,
            renew_every=settings.task_renewal_period,
            watch_every=_DAEMON_LEASES_WATCH if daemon_leases else None,
            urgent=urgent,
            on_renewed=renewed,
        )
        self._reader = StoreReader(js, settings, store)
        # Paused change sets and workspaces (rebaser_core.pauses), watched: an owned one is let go when paused.
        self.pauses = PauseWatcher(js, settings, on_pause=self._on_pause)
        # lease_mode daemon: a heartbeat per daemon, and peers that hand a silent one's tasks back (liveness.py).
        self.liveness = Liveness(nats, settings, placement, store, owner, stats) if daemon_leases else None
        self._owning = Owning(
            nats,
            settings,
            app,
            store,
            owner,
            keeper,
            replies,
            report,
            placement,
            self._reader,
            self.pauses,
            None if self.liveness is None else self.liveness.heartbeat,
        )
        self.sweeper = Sweeper(nats, settings, placement, replies, paused=self.pauses.paused)
        self.queries = QueryService(nc, js, settings, app=app, store=store, placement=placement)
        self._sweep = sweep
        # Change sets taken but not yet past their cold path, and waiting for a slot (rebaser_server.intake.admission).
        self._admission = Admission(settings)
        # The change sets owned now, one processor each (rebaser_server.daemon.owned).
        self._owned = OwnedChangeSets(self._owning, self._admission)
        self._stopping = False
        self._app_stopping = False  # shutdown has come to stopping the app (see _start_app)
        # One pull loop (_pull) per served shard: rebaser_server.daemon.shards.
        self.shards = ShardPullers(
            nats,
            settings,
            placement,
            self._pull,
            expires=FETCH_TIMEOUT,
            on_intake_switch=self._on_intake_switch,
        )
        # The fair intake's loop per served shard (run by _pull when the layout's intake is fair).
        self.intakes = FairIntakes(
            placement,
            lambda names: FairIntake(
                nats,
                settings,
                placement,
                names,
                self._owned,
                self._admission,
                stopping=lambda: self._stopping,
                lapsed=self._lapsed,
            ),
            lambda names: LaneIntake(
                nats,
                settings,
                placement,
                names,
                self._owned,
                self._admission,
                lanes=max(placement.layout.lanes, 1),
                stopping=lambda: self._stopping,
                lapsed=self._lapsed,
            ),
        )
        self._owned.on_handed_back = self.intakes.handed_back
        self._fifo = FifoIntake(
            self._owning,
            self._owned,
            self._admission,
            stopping=lambda: self._stopping,
            lapsed=self._lapsed,
            others_waiting=lambda: others_waiting(self.health, self.shards.shards),
        )
        self._sweeper_task: asyncio.Task[None] | None = None
        self.watch = ConnectionWatch(nc)
        self.health = StatusReporter(
            nc, settings, self.watch, layout=lambda: placement.layout, paused=self.pauses.targets
        )
        self.health.problems = self.shards.problems  # an unreadable layout entry (shards.py)
        self._durability = DurabilityCheck(js, settings, owner=owner)
        # Why the daemon stopped by itself (None: it was asked to, or has not stopped); the CLI exits non-zero then.
        self.failure: str | None = None
        self._failing: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self.stopped = asyncio.Event()
        self.serving = False  # set-up done (/readyz): see start

    async def start(self, *, timeout: float | None = None) -> None:
        """Set up streams, consumer, store and app, then serve. While NATS or JetStream is not available yet (a
        cluster still forming, a stream leader being elected) set-up is retried with backoff, for ``timeout``
        seconds (None: for ever), each failure one log line."""
        owning = self._owning
        # What the app lacks of the contract's optional parts, and so what the daemon answers without them.
        log.info("%s", capabilities(owning.app))
        await self._set_up(timeout)
        if self._stopping:
            return  # shut down while starting (a signal): start nothing
        floor = await self._check_durability()
        if floor is not None:
            raise DurabilityTooLow(floor)
        await self.queries.start()
        await owning.keeper.start()
        if self.liveness is not None:
            # Beating before the first task is taken; retried like the set-up (a fresh cluster may still elect the
            # heartbeat bucket's leader).
            await set_up_with_retries(self.liveness.start, timeout=timeout, stopping=lambda: self._stopping)
        if self._stopping:
            return  # shut down meanwhile: take no task
        await self.shards.start()
        if self._sweep:
            self._sweeper_task = asyncio.create_task(self.sweeper.run(), name="rebaser orphan sweep")
        self._watch_task = asyncio.create_task(self.watch.run(self._on_reconnect), name="rebaser NATS watch")
        self.serving = True
        log.info(
            "rebaser daemon %s serving (prefix=%s, concurrency=%d, shards %s of %d, %s)",
            owning.owner,
            owning.settings.prefix,
            owning.settings.concurrency,
            self.shards.shards,
            owning.placement.layout.streams,
            owning.placement.layout.mode,
        )

    async def _set_up(self, timeout: float | None) -> None:
        async def prepare() -> None:
            await self.shards.set_up()  # the layout (flags checked against it) and every shard's streams
            await self._owning.store.open()
            await self._reader.open()
            await self.pauses.start()  # before any task is taken: a paused change set is never touched

        await set_up_with_retries(prepare, self._start_app, timeout=timeout, stopping=lambda: self._stopping)

    async def _start_app(self) -> None:
        owning = self._owning
        await start_app(owning.app, owning.nats.nc, owning.settings, stopping=lambda: self._app_stopping)

    def _lapsed(self) -> bool:
        """lease_mode daemon: this daemon's heartbeat lapsed. It takes no task then (one taken would go straight
        back: it could hold it under no generation), until the heartbeat is confirmed again."""
        return self.liveness is not None and not self.liveness.heartbeat.held()

    async def _pull(self, sub: TaskPuller, subjects: Subjects) -> None:
        """The intake of one served shard: its tasks consumer pulled in order (fifo_intake.py), or its workspaces
        served in turns (fair_intake.py)."""
        intake = self._owning.placement.layout.intake
        if intake == "fair":
            await self.intakes.run(subjects)
        elif intake == "lanes":
            await self.intakes.run_lanes(subjects)
        else:
            await self._fifo.run(sub, subjects)

    async def _on_reconnect(self) -> None:
        """After a reconnect: owned change sets handed back, streams ensured, durability checked, orphans swept
        (reconnect.py); the daemon stops if the server it reached now keeps too little."""
        if self._stopping:
            self._owning.report.stats.nats_reconnects += 1
            return
        floor = await recover_after_reconnect(
            self._owning,
            self._owned,
            self._reader,
            check_durability=self._check_durability,
            sweep_once=self.sweeper.sweep_once if self._sweep else None,
        )
        if floor is not None:
            log.error("%s; stopping", floor)
            self.failure = floor
            # Referenced, so it runs to its end; shutdown stops this watch's task, so it cannot be awaited here.
            self._failing = asyncio.create_task(self.shutdown(), name="rebaser shutdown (durability)")

    async def _on_intake_switch(self) -> None:
        """The intake changes (``rebaser streams intake``): hand every owned change set back (finish the request in
        hand, nack the task) while the old intake's consumers still exist; the new intake takes them again."""
        log.warning("the intake changes: handing back %d owned change sets", self._owned.interrupt_all())

    async def _check_durability(self) -> str | None:
        """Check what acknowledgements survive now; what is wrong if that is below ``require_durability``."""
        settings = self._owning.settings
        result = await self._durability.check(durable_streams(settings, self._owning.placement.layout.shards))
        self._owning.placement.fsync_always = result.sync == "always"
        if meets(result.level, settings.require_durability):
            return None
        return (
            f"acknowledged requests survive only {result.level} here (sync {result.sync}, "
            f"replicas {result.min_replicas}), below require_durability {settings.require_durability}"
        )

    def alive(self) -> str | None:
        """None if the daemon's loops run as they should; else what is wrong (for ``/healthz``)."""
        if not self._stopping and self.shards.stopped_unexpectedly():
            return "a task puller has stopped"
        if not self._stopping and self._watch_task is not None and self._watch_task.done():
            return "the NATS watch has stopped"
        if not self._stopping and self.shards.shards and not self._owning.keeper.running:
            return "the lease keeper has stopped"
        return None

    def _on_pause(self, workspace: WorkspacePk, change_set: ChangeSetId | None, pause: Pause) -> None:
        """A pause appeared: the owned change sets it covers let go at their next request boundary."""
        for processor in self._owned.processors():
            held = processor.change_set
            if held.workspace_id == workspace and change_set in (None, held.change_set_id):
                processor.pause(pause.reason)

    async def status(self) -> dict[str, Any]:
        """Everything ``/status`` shows (:func:`rebaser_server.ops.status.status_of`)."""
        return await status_of(self)

    async def shutdown(self) -> None:
        """Stop taking tasks, finish the requests in hand (bounded), nack owned tasks so others take them now.

        Every step is bounded (a NATS call that never answers, or an app that ignores cancellation, must not keep
        the daemon from stopping): at most about ``FETCH_TIMEOUT * 4 + shutdown_grace + 5 + 3 * nats_timeout``.
        """
        if self._stopping:
            await self.stopped.wait()
            return
        self._stopping = True
        self._admission.wake()
        settings = self._owning.settings
        # Each puller may finish its fetch; then it is stopped, and what it fetched but never took is handed back.
        await self.shards.stop(grace=FETCH_TIMEOUT * 3)
        self.sweeper.stop()
        for background in (self._sweeper_task, self._watch_task):
            if background is not None:
                await stop_task(background, grace=0, after_cancel=settings.nats_timeout)
        self._owned.interrupt_all()
        left = await self._owned.wait(timeout=settings.shutdown_grace + 5.0)
        if left:
            log.error("%d change sets did not finish handing back in time", left)
        await self._owning.keeper.stop()
        if self.liveness is not None:
            handed_back = not left and not self._owned.unconfirmed_hand_backs
            if not handed_back:
                log.warning(
                    "not every hand-back was confirmed: the heartbeat is left to lapse, and peers hand back what this "
                    "daemon may still hold after ack_wait"
                )
            await self.liveness.stop(handed_back=handed_back)
        await self.pauses.stop()
        await self._owned.fair.stop()
        self._app_stopping = True
        # The queries get twice the NATS timeout: their stop itself waits up to one for the held settled-waits to
        # answer "ask again"; cut at one, those answers were lost under load and the callers waited on.
        budgets = {"queries": 2 * settings.nats_timeout, "app": settings.nats_timeout}
        for what, stop in (("queries", self.queries.stop), ("app", self._owning.app.stop)):
            try:
                async with asyncio.timeout(budgets[what]):
                    await stop()
            except Exception as err:
                log.warning("stopping the %s failed: %r", what, err)
        self.stopped.set()
        log.info("rebaser daemon %s stopped", self._owning.owner)
