"""One change set, owned: consume its requests in order, one at a time, then let it go safely.

Life of a task (the daemon holds the change set's task delivery for all of it, under a :class:`Lease`):

1. **Acquire**: bump the record's epoch (fences every earlier owner) unless the delivery is stale; join the
   daemon's lease keeper (confirmed progress acks that renew the lease, and the watchdog) and start the change
   set's DVU runs (``dvu_runs``).
2. **Consume**: an ordered push consumer on the change set's request subject (``consumer.py``) hands its requests
   to ``_on_request`` one at a time, in stream order. Nothing is applied unless the lease is held. Each request is
   decided (``handling.py``) and the decision carried out by the post-process step (``postprocess.py``).
3. **Finish** with one outcome (see ``outcome.py``): quiet for ``quiescent_period`` -> release; retryable failure
   -> nack with backoff; shutdown -> nack now; wedged -> nack; fenced, lease lost or stale -> touch nothing; paused
   (seen before a request, or told by the daemon's watch of the pauses; or its record unreadable, which pauses it:
   ``quarantine.py``) -> ack, without the release's check.
4. **Release** (the quiescence race): stop consuming, finish the DVU, ack the task, and only then ask "is any
   request still queued?". A request published before the ack either made its client's task publish fail (a task
   still existed) and is seen by that check, or its task publish comes after the ack and succeeds. Either way it
   gets a task; no window strands it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import nats.errors
from nats.aio.msg import Msg

from rebaser_core.errors import DecodeError, FencedError
from rebaser_core.pauses import Pause
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet, CommitHooks
from rebaser_server.changeset.cold_start import ColdStart
from rebaser_server.changeset.consumer import RequestConsumer
from rebaser_server.changeset.decisions import Kind
from rebaser_server.changeset.dvu_runs import Activity, ChangeSetDvu
from rebaser_server.changeset.events import ChangeSetFeed
from rebaser_server.changeset.group import CommitGroup
from rebaser_server.changeset.handling import RequestHandler
from rebaser_server.changeset.idle import IdleWatch
from rebaser_server.changeset.outcome import LeaseLost, Outcome, PauseNow, Retry, TaskResult, Wedged, failed
from rebaser_server.changeset.owning import Owning
from rebaser_server.changeset.postprocess import PostProcess
from rebaser_server.changeset.quarantine import quarantine
from rebaser_server.changeset.release import let_go_paused, mark_handed_back, release, resumed_meanwhile
from rebaser_server.changeset.steps import Steps
from rebaser_server.changeset.trimmer import Trimmer
from rebaser_server.record.handle import ChangeSetHandle
from rebaser_server.record.store import StaleDelivery, TaskDelivery
from rebaser_server.task.delivery import Delivery
from rebaser_server.task.lease import Lease

__all__ = ["ChangeSetProcessor", "Outcome", "TaskResult"]

log = logging.getLogger(__name__)


class ChangeSetProcessor:
    def __init__(
        self,
        owning: Owning,
        change_set: ChangeSet,
        task_msg: Msg,
        *,
        pulled_at: float,
        subjects: Subjects,
        on_started: Callable[[ChangeSetProcessor], None] | None = None,
    ) -> None:
        self._owning = owning
        nats, settings, report = owning.nats, owning.settings, owning.report
        # Called once the cold path is over (the daemon's admission): the first request delivered, or nothing queued.
        # Not once it is handled: an app slow or wedged on it must not keep the daemon from taking other change sets.
        self._on_started = on_started
        # The shard the task came from: its requests are read, purged and checked there.
        self._names = subjects
        self.change_set = change_set
        self._task_msg = task_msg
        self.lease = Lease(
            nats.nc,
            task_msg,
            ack_wait=settings.consumer_ack_wait,
            margin=0.2 * settings.consumer_ack_wait,
            since=pulled_at,
            requester=nats.requester,
            heartbeat=owning.heartbeat,
        )
        self._subject = self._names.requests(change_set.workspace_id, change_set.change_set_id)
        self._result: asyncio.Future[TaskResult] = asyncio.get_running_loop().create_future()
        self._stopping = False
        # Held while one request is processed; release takes it to wait for the request in hand.
        self._request_lock = asyncio.Lock()
        self._handle: ChangeSetHandle | None = None
        # A pause this ownership decided (a request failed max_attempts times): stored before the task is acked.
        self._pause_to_store: Pause | None = None
        # Taken over from an owner that died or froze: count an attempt against the first request, and commit
        # every request on its own for the rest of this ownership (PostProcess, one_by_one).
        self._unclean = False
        # The change set's ordered consumer (consumer.py).
        self._consumer = RequestConsumer(
            self._names,
            self._subject,
            nc=nats.nc,
            requester=nats.requester,
            settings=settings,
            stats=report.stats,
        )
        # When the last request was handled, and whether one waits: read by the DVU runs (a due one runs in a lull,
        # so a burst of requests shares few) and by the release.
        self._activity = Activity()
        # When the change set lets go on its own (the quiet rule), and what wakes it to look again.
        self._idle = IdleWatch(
            change_set,
            self._names,
            placement=owning.placement,
            settings=settings,
            activity=self._activity,
            request_lock=self._request_lock,
        )
        # The app steps (applies and DVU runs), run under the lease; the watchdog asks whether one overran.
        self._steps = Steps(self.lease)
        self._trimmer = Trimmer(
            change_set,
            self._names,
            requester=nats.requester,
            settings=settings,
            report=report,
            placement=owning.placement,
        )
        # What the change set's followers are told (events.py).
        self._feed = ChangeSetFeed(
            change_set,
            requester=nats.requester,
            subjects=owning.replies.subjects,
            owner=owning.owner,
            stats=report.stats,
            timeout=settings.nats_timeout,
            enabled=settings.events,
            window=settings.events_window,
        )
        # Created once the change set's record is acquired: the post-process step (and its commit group).
        self._post: PostProcess | None = None
        self._handler = RequestHandler(
            change_set,
            app=owning.app,
            settings=settings,
            observe=report.observe,
            step=self._steps.run,
            subjects=owning.replies.subjects,
        )
        self._dvu = ChangeSetDvu(
            change_set,
            app=owning.app,
            settings=settings,
            report=report,
            steps=self._steps,
            lease=self.lease,
            activity=self._activity,
            feed=self._feed,
            finish=self._finish,
        )

    # -- public -------------------------------------------------------------------------------------
    @property
    def subjects(self) -> Subjects:
        """The names of the shard this change set's task came from."""
        return self._names

    def pause(self, reason: str) -> None:
        """The change set was paused: finish the request in hand, then let it go (no DVU, no release check)."""
        self._finish(Outcome.PAUSED, reason=f"paused: {reason}")

    def interrupt(self) -> None:
        """Graceful shutdown: finish the request in hand (bounded), then hand the task back."""
        self._finish(Outcome.INTERRUPTED, reason="shutdown")

    async def run(self) -> TaskResult:
        owning = self._owning
        settings, report = owning.settings, owning.report
        if not self.lease.held():
            # Delivered before this process was paused (it sat in the pull buffer): the server may have given the
            # task to another daemon meanwhile. Acting on it (even a nack) could take it from that daemon.
            return TaskResult(Outcome.STALE, reason="task delivery older than the lease")
        paused = await owning.pauses.holding(self.change_set)
        if paused is not None:
            # Taken while paused (a request published since, or a task from before the pause): let it go untouched.
            await self.lease.ack(timeout=settings.nats_timeout)
            await resumed_meanwhile(
                self.change_set,
                self._names,
                pauses=owning.pauses,
                nats=owning.nats,
                settings=settings,
                report=report,
            )
            return TaskResult(Outcome.PAUSED, reason=f"paused: {paused.reason}")
        # Lease renewals and the watchdog: the daemon's keeper, for every owned change set (keeper.py).
        owning.keeper.add(self)
        # Whether a request is queued, read while the record is; the consumer made once worth it (cold_start.py).
        cold = ColdStart(
            owning.nats.reads.last_message(
                self._names.requests_stream, self._subject, timeout=settings.nats_timeout
            ),
            self._consumer.create,
        )
        try:
            try:
                acquired = await owning.store.acquire(
                    self.change_set,
                    owning.owner,
                    owning.app.initial_state(self.change_set),
                    TaskDelivery.of(self._task_msg),
                    shard=self._names.shard,
                    has_work=cold.has_work,
                )
            except StaleDelivery as err:
                return TaskResult(Outcome.STALE, reason=str(err))
            except FencedError as err:
                return TaskResult(Outcome.RETRY, settings.retry_backoff, str(err))
            except DecodeError as err:  # garbage in the record: paused, not retried for ever (quarantine.py)
                return await quarantine(self.change_set, self.lease, err, self._names, owning)
            if not self.lease.held():
                return TaskResult(Outcome.LEASE_LOST, reason="lease ran out while acquiring")
            self._handle, self._unclean = acquired.handle, acquired.unclean
            if self._unclean:
                report.stats.unclean_takeovers += 1
            group = CommitGroup(
                self.change_set,
                self._handle,
                commit_hooks=CommitHooks.of(owning.app),
                trimmer=self._trimmer,
                replies=owning.replies,
                report=report,
                feed=self._feed,
                notify_dvu=self._dvu.notify,
            )
            self._post = PostProcess(
                group,
                lock=self._request_lock,
                one_by_one=acquired.unclean,
                idempotency_window=settings.idempotency_window,
                on_failure=self._fail,
            )
            self._feed.taken(self._handle.record)
            await report.hooks.checkpoint("acquired", self.change_set)
            self._dvu.start(self._handle)
            await self._bind(await cold.consumer())  # (a record, nothing queued: a redelivered or swept task)
            if self._idle.caught_up:
                self._started()
                # Nothing queued (a redelivered or swept task): release at once. Safe for the same reason every
                # release is: a request published meanwhile is found by the check after the ack.
                self._finish(Outcome.RELEASED, reason="nothing queued")
            await self._wait_for_outcome()
            return await self._finish_task(self._result.result())
        finally:
            self._feed.close()
            owning.keeper.remove(self)
            await self._dvu.stop(timeout=settings.nats_timeout)
            await cold.close()
            await self._consumer.close()
            # The post-process step holds this processor's ``_fail``, and this processor holds it: without this the
            # pair is freed only by the cycle collector.
            self._post = None

    async def hand_back_after_lapse(self) -> bool:
        """:meth:`Lease.hand_back_after_lapse`, the record claimed first if this ownership wrote one."""
        handle = self._handle
        claim = handle.claim_after_lapse if handle is not None and handle.written else None
        return await self.lease.hand_back_after_lapse(claim)

    def _started(self) -> None:
        callback, self._on_started = self._on_started, None
        if callback is not None:
            callback(self)

    # -- consuming ----------------------------------------------------------------------------------
    async def _bind(self, queued: int) -> None:
        self._idle.caught_up = queued == 0
        log.debug("%s: consuming, %d requests queued", self.change_set, queued)
        if not self._idle.caught_up:
            self._activity.lull.clear()
        await self._consumer.bind(self._on_request)

    async def _on_request(self, msg: Msg, delivery: Delivery) -> None:
        self._started()
        if self._stopping:
            return  # left in the stream: the release check or the next owner will see it
        async with self._request_lock:
            if self._stopping:
                return
            if not self.lease.held():
                # Paused or cut off past the lease: another daemon may own the change set now. Apply nothing.
                self._finish(Outcome.LEASE_LOST, reason="lease ran out before a request")
                return
            paused = self._owning.pauses.paused(self.change_set)
            if paused is not None:  # a request boundary: nothing more is applied
                self.pause(paused.reason)
                return
            post = self._post
            assert post is not None
            try:
                unclean, self._unclean = self._unclean, False
                # Metrics, log ids and the trace span of this request (rebaser_server.ops.observe).
                with self._owning.report.observe.request(msg, self.change_set, delivery.stored_at):
                    # Decide, then carry out; an attempt counted against a suspect request (COUNTED) is on record
                    # before the request is decided again, as a clean one.
                    while True:
                        record = await post.open()
                        decision = await self._handler.decide(
                            msg, delivery.stream_seq, record, unclean=unclean
                        )
                        await post.carry_out(decision, delivery.num_pending)
                        if decision.kind is not Kind.COUNTED:
                            break
                        unclean = False
            except PauseNow as err:
                self._pause_to_store = Pause.now("max_attempts", str(err), err.request_id)
                self._fail(err)
            except Exception as err:
                self._fail(err)
            except asyncio.CancelledError:
                # Not the consumer's close() (we would be stopping): a cancellation from inside a step. The request
                # was cut short, so no later one may be handled before it: retry the task (the next owner reads both).
                if not self._stopping:
                    self._finish(
                        Outcome.RETRY,
                        self._owning.settings.retry_backoff,
                        "a request's handling was cancelled",
                    )
                raise
            finally:
                self._activity.last = time.monotonic()
                self._idle.request_ended()
                self._idle.caught_up = delivery.num_pending == 0
                if self._idle.caught_up:
                    self._activity.lull.set()
                else:
                    self._activity.lull.clear()

    def _fail(self, err: Exception) -> None:
        """End the task after a failure while processing; an open commit group is settled by ``_finish_task``."""
        if isinstance(err, nats.errors.Error | TimeoutError):
            # Infrastructure trouble (NATS, KV): the request stays first in line; the task is retried later.
            log.warning("%s: NATS trouble while processing a request: %r", self.change_set, err)
        elif not isinstance(err, FencedError | LeaseLost | Retry | Wedged):
            # Not one of the typed ways a task ends (fenced, lease lost, retry, wedged): a bug, say.
            log.error("%s: processing a request failed", self.change_set, exc_info=err)
        result = failed(err, self._owning.settings.retry_backoff)
        self._finish(result.outcome, result.delay, result.reason)

    # -- watchdog and keep-alive --------------------------------------------------------------------
    def watch(self, now: float) -> bool:
        """The watchdog, called by the daemon's lease keeper at least every progress_period (and when the lease is
        due to run out): stop everything once the lease runs out, give the task up if a step wedges. False once no
        more renewals are wanted."""
        settings, lease = self._owning.settings, self.lease
        # While disconnected nothing is applied (held() is False) but the lease may still be good: after a short
        # outage the reconnect handler hands the task back at once instead of letting it stall for ack_wait.
        if lease.remaining() <= 0:
            log.warning("%s: lease on the task ran out; stopping without touching it", self.change_set)
            self._owning.report.stats.leases_lost += 1
            self._finish(Outcome.LEASE_LOST, reason="lease ran out")
            self._steps.cancel(LeaseLost)
            return False
        self._consumer.watch(now)  # a request consumer silent for two heartbeats is replaced
        if self._steps.overran(now, settings.handler_deadline):
            log.error(
                "%s: a step overran handler_deadline (%.1fs); giving the task up",
                self.change_set,
                settings.handler_deadline,
            )
            self._finish(Outcome.WEDGED, reason="handler_deadline exceeded")
            self._steps.cancel(Wedged)
            return False
        self.nudge(now)
        return True

    def nudge(self, now: float) -> bool:
        """Let go now if idle enough and others wait for a slot, or the shard moved (idle.py). Whether it will."""
        return self._idle.nudge(now)

    # -- finishing ----------------------------------------------------------------------------------
    def _finish(self, outcome: Outcome, delay: float = 0.0, reason: str = "") -> None:
        # Stop taking requests at once: after a failure the next request must not overtake the failed one.
        self._stopping = True
        if not self._result.done():
            self._result.set_result(TaskResult(outcome, delay, reason))
        self._idle.wake()

    async def _wait_for_outcome(self) -> None:
        await self._idle.wait(self._result, lambda why: self._finish(Outcome.RELEASED, reason=why))

    async def _finish_task(self, result: TaskResult) -> TaskResult:
        owning = self._owning
        settings = owning.settings
        self._stopping = True
        grace = (
            settings.shutdown_grace if result.outcome is Outcome.INTERRUPTED else settings.handler_deadline
        )
        # Let the request in hand finish (a wedged step was cancelled, so that one ends at once); its commit is
        # fenced anyway if we lost the change set meanwhile.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                async with self._request_lock:
                    if self._post is not None:
                        await self._post.settle(
                            owned=result.outcome not in (Outcome.FENCED, Outcome.LEASE_LOST)
                        )
        await self._consumer.close()
        # Not PAUSED: no DVU then.
        if result.outcome in (Outcome.RELEASED, Outcome.RETRY, Outcome.INTERRUPTED):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._dvu.drain()  # a DVU cut short stays due in the record (dvu_pending)
        await self._trimmer.flush(settings.nats_timeout)
        if result.outcome is Outcome.PAUSED:
            return await let_go_paused(
                self.change_set,
                self.lease,
                pauses=owning.pauses,
                decided=self._pause_to_store,
                feed=self._feed,
                subjects=self._names,
                nats=owning.nats,
                settings=settings,
                report=owning.report,
                result=result,
            )
        if result.outcome.hands_back or result.outcome is Outcome.RELEASED:
            # Said while still the owner: after the ack (or nack) the next owner's ``taken`` may come first.
            await self._feed.released(result.outcome.value)
        if result.outcome.hands_back:
            await mark_handed_back(self._handle, self.lease, settings.nats_timeout)
        if result.outcome is not Outcome.RELEASED:
            return result
        assert self._handle is not None
        return await release(
            self.change_set,
            self._handle,
            self.lease,
            self._names,
            nats=owning.nats,
            settings=settings,
            report=owning.report,
        )
