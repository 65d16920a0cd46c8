"""One change set, owned: consume its requests in order, one at a time, then let it go safely.

Life of a task (the daemon holds the change set's task delivery for all of it, under a :class:`Lease`):

1. **Acquire**: bump the record's epoch (fences every earlier owner) unless the delivery is stale; join the
   daemon's lease keeper (confirmed progress acks that renew the lease, and the watchdog) and start the change
   set's DVU runs (``dvu_runs``).
2. **Consume**: an ordered push consumer on the change set's request subject (``consumer.py``) hands its requests
   to ``_on_request`` one at a time, in stream order. Nothing is applied unless the lease is held.
3. **Finish** with one outcome (see ``outcome.py``): quiet for ``quiescent_period`` -> release; retryable failure
   -> nack with backoff; shutdown -> nack now; wedged -> nack; fenced, lease lost or stale -> touch nothing.
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
from dataclasses import replace

import nats.errors
from nats.aio.msg import Msg

from rebaser_core.errors import FencedError
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.consumer import RequestConsumer
from rebaser_server.delivery import Delivery
from rebaser_server.dvu_runs import Activity, ChangeSetDvu
from rebaser_server.group import CommitGroup
from rebaser_server.handling import RequestHandler
from rebaser_server.lease import Lease
from rebaser_server.migration import draining
from rebaser_server.outcome import LeaseLost, Outcome, Retry, TaskResult, Wedged
from rebaser_server.release import release
from rebaser_server.runtime import Runtime
from rebaser_server.state import ChangeSetHandle, StaleDelivery, TaskDelivery
from rebaser_server.steps import Steps
from rebaser_server.trimmer import Trimmer

__all__ = ["ChangeSetProcessor", "Outcome", "TaskResult"]

log = logging.getLogger(__name__)


# A commit group is committed when nothing more is waiting, when it holds this many requests, or after this long.
# Its size is also capped at half the idempotency window (see Trimmer: every processed request still in the
# stream must stay within the window).
_GROUP_MAX = 32
_GROUP_MAX_WAIT = 0.005
# Under pressure (the daemon is full and other change sets wait for an owner), a change set idle this long lets go.
_PRESSURE_QUIET = 1.0


class ChangeSetProcessor:
    def __init__(
        self,
        rt: Runtime,
        change_set: ChangeSet,
        task_msg: Msg,
        *,
        pulled_at: float,
        subjects: Subjects | None = None,
        on_started: Callable[[ChangeSetProcessor], None] | None = None,
    ) -> None:
        self._rt = rt
        # Called once the cold path is over (the daemon's admission): the first request delivered, or nothing queued.
        # Not once it is handled: an app slow or wedged on it must not keep the daemon from taking other change sets.
        self._on_started = on_started
        # The shard the task came from: its requests are read, purged and checked there.
        self._names = subjects or rt.subjects
        self.change_set = change_set
        self._task_msg = task_msg
        settings = rt.settings
        self.lease = Lease(
            rt.nc,
            task_msg,
            ack_wait=settings.ack_wait,
            margin=settings.lease_margin,
            since=pulled_at,
            requester=rt.requester,
        )
        self._subject = self._names.requests(change_set.workspace_id, change_set.change_set_id)
        self._result: asyncio.Future[TaskResult] = asyncio.get_running_loop().create_future()
        self._wake: asyncio.Future[None] | None = None  # resolved to make _wait_for_outcome look again
        self._wake_after_request = False  # ... and that when the request in hand ends
        self._stopping = False
        # Held while one request is processed; release takes it to wait for the request in hand.
        self._request_lock = asyncio.Lock()
        self._handle: ChangeSetHandle | None = None
        # Taken over from an owner that died or froze: count an attempt against the first request, and commit
        # every request on its own for the rest of this ownership (see _maybe_flush).
        self._unclean = False
        self._suspect_mode = False
        # The change set's ordered consumer (consumer.py).
        self._consumer = RequestConsumer(rt, self._names, self._subject)
        self._caught_up = False
        # When the last request was handled, and whether one waits: read by the DVU runs (a due one runs in a lull,
        # so a burst of requests shares few) and by the release.
        self._activity = Activity()
        # The app steps (applies and DVU runs), run under the lease; the watchdog asks whether one overran.
        self._steps = Steps(self.lease)
        self._trimmer = Trimmer(rt, change_set, self._names)
        self._commits: CommitGroup | None = None  # created once the change set's record is acquired
        self._handler: RequestHandler | None = None
        self._flush_timer: asyncio.Task[None] | None = None
        self._dvu = ChangeSetDvu(
            rt, change_set, steps=self._steps, lease=self.lease, activity=self._activity, finish=self._finish
        )

    # -- public -------------------------------------------------------------------------------------
    @property
    def subjects(self) -> Subjects:
        """The names of the shard this change set's task came from."""
        return self._names

    def interrupt(self) -> None:
        """Graceful shutdown: finish the request in hand (bounded), then hand the task back."""
        self._finish(Outcome.INTERRUPTED, reason="shutdown")

    async def run(self) -> TaskResult:
        rt = self._rt
        if not self.lease.held():
            # Delivered before this process was paused (it sat in the pull buffer): the server may have given the
            # task to another daemon meanwhile. Acting on it (even a nack) could take it from that daemon.
            return TaskResult(Outcome.STALE, reason="task delivery older than the lease")
        # Lease renewals and the watchdog: the daemon's keeper, for every owned change set (keeper.py).
        rt.keeper.add(self)
        # The change set's consumer is created while its record is read and bumped (one round trip fewer before
        # the first request); nothing is delivered before _bind subscribes, which is after the acquire. Its
        # num_pending also tells a task with nothing to do (no record, nothing queued).
        consumer = asyncio.ensure_future(self._consumer.create())
        try:
            try:
                acquired = await rt.store.acquire(
                    self.change_set,
                    rt.owner,
                    rt.app.initial_state(self.change_set),
                    TaskDelivery.of(self._task_msg),
                    shard=self._names.shard,
                    has_work=lambda: self._has_queued(consumer),
                )
            except StaleDelivery as err:
                return TaskResult(Outcome.STALE, reason=str(err))
            except FencedError as err:
                return TaskResult(Outcome.RETRY, rt.settings.retry_backoff, str(err))
            if not self.lease.held():
                return TaskResult(Outcome.LEASE_LOST, reason="lease ran out while acquiring")
            self._handle, self._unclean = acquired.handle, acquired.unclean
            self._suspect_mode = acquired.unclean
            if self._unclean:
                rt.stats.unclean_takeovers += 1
            self._commits = CommitGroup(rt, self.change_set, self._handle, self._trimmer, self._dvu.notify)
            self._handler = RequestHandler(rt, self.change_set, self._commits, self._steps.run)
            await rt.hooks.checkpoint("acquired", self.change_set)
            self._dvu.start(self._handle)
            await self._bind(await consumer)
            if self._caught_up:
                self._started()
                # Nothing queued (a redelivered or swept task): release at once. Safe for the same reason every
                # release is: a request published meanwhile is found by the check after the ack.
                self._finish(Outcome.RELEASED, reason="nothing queued")
            await self._wait_for_outcome()
            return await self._finish_task(self._result.result())
        finally:
            rt.keeper.remove(self)
            await self._dvu.stop(timeout=self._rt.settings.nats_timeout)
            if not consumer.done():
                # Bounded by nats_timeout (the JetStream context's); once it exists it can be deleted.
                await asyncio.wait({consumer})
            if not consumer.cancelled():
                consumer.exception()  # retrieved: a failure to create it is the acquire's or the bind's to report
            await self._consumer.close()

    def _started(self) -> None:
        callback, self._on_started = self._on_started, None
        if callback is not None:
            callback(self)

    # -- consuming ----------------------------------------------------------------------------------
    async def _has_queued(self, consumer: asyncio.Future[int]) -> bool:
        return (await consumer) > 0

    async def _bind(self, queued: int) -> None:
        self._caught_up = queued == 0
        log.debug("%s: consuming, %d requests queued", self.change_set, queued)
        if not self._caught_up:
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
            assert self._handler is not None
            try:
                unclean, self._unclean = self._unclean, False
                # Metrics, log ids and the trace span of this request (rebaser_server.observe).
                with self._rt.observe.request(msg, self.change_set, delivery.stored_at):
                    await self._handler.handle(msg, delivery.stream_seq, unclean=unclean)
                    await self._maybe_flush(delivery.num_pending)
            except Exception as err:
                self._fail(err)
            except asyncio.CancelledError:
                # Not the consumer's close() (we would be stopping): a cancellation from inside a step. The request
                # was cut short, so no later one may be handled before it: retry the task (the next owner reads both).
                if not self._stopping:
                    self._finish(
                        Outcome.RETRY, self._rt.settings.retry_backoff, "a request's handling was cancelled"
                    )
                raise
            finally:
                self._activity.last = time.monotonic()
                if self._wake_after_request:
                    self._wake_waiter()
                self._caught_up = delivery.num_pending == 0
                if self._caught_up:
                    self._activity.lull.set()
                else:
                    self._activity.lull.clear()

    def _fail(self, err: Exception) -> None:
        """End the task after a failure while processing; an open commit group is settled by ``_finish_task``."""
        if isinstance(err, FencedError):
            self._finish(Outcome.FENCED, reason=str(err))
        elif isinstance(err, LeaseLost):
            self._finish(Outcome.LEASE_LOST, reason="lease ran out during a step")
        elif isinstance(err, Retry):
            self._finish(Outcome.RETRY, err.delay, str(err))
        elif isinstance(err, Wedged):
            self._finish(Outcome.WEDGED, reason="request handler overran handler_deadline")
        else:
            # Infrastructure trouble (NATS, KV): the request stays first in line; retry the task later.
            if isinstance(err, nats.errors.Error | TimeoutError):
                log.warning("%s: NATS trouble while processing a request: %r", self.change_set, err)
            else:
                log.error("%s: processing a request failed", self.change_set, exc_info=err)
            self._finish(Outcome.RETRY, self._rt.settings.retry_backoff, f"{type(err).__name__}: {err}")

    async def _maybe_flush(self, waiting: int) -> None:
        """Commit now unless more requests are already waiting (``waiting`` of them behind this one) and the group
        has room (then soon, by timer)."""
        assert self._commits is not None
        # After an unclean takeover, no group commit: the request that killed the last owner may sit anywhere in
        # its uncommitted group, and committing one by one puts the blame (the suspect count) on the right one.
        if (
            self._suspect_mode
            or not waiting
            or len(self._commits) >= min(_GROUP_MAX, self._rt.settings.idempotency_window // 2)
        ):
            await self._commits.flush()
        elif self._flush_timer is None or self._flush_timer.done():
            self._flush_timer = asyncio.create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        # The next request may be slow to arrive (flow control, a consumer reset): do not let replies wait for it.
        await asyncio.sleep(_GROUP_MAX_WAIT)
        async with self._request_lock:
            if self._commits is not None and self._commits.open:
                try:
                    await self._commits.flush()
                except Exception as err:
                    self._fail(err)

    # -- watchdog and keep-alive --------------------------------------------------------------------
    def watch(self, now: float) -> bool:
        """The watchdog, called by the daemon's lease keeper at least every progress_period (and when the lease is
        due to run out): stop everything once the lease runs out, give the task up if a step wedges. False once no
        more renewals are wanted."""
        settings, lease = self._rt.settings, self.lease
        # While disconnected nothing is applied (held() is False) but the lease may still be good: after a short
        # outage the reconnect handler hands the task back at once instead of letting it stall for ack_wait.
        if lease.remaining() <= 0:
            log.warning("%s: lease on the task ran out; stopping without touching it", self.change_set)
            self._rt.stats.leases_lost += 1
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
        if (
            self._wake is not None
            and self._caught_up
            and now - self._activity.last >= _PRESSURE_QUIET
            and (self._rt.pressure or draining(self._rt, self.change_set, self._names))
        ):
            self._wake_waiter()  # idle long enough to give way: _wait_for_outcome lets it go
        return True

    # -- finishing ----------------------------------------------------------------------------------
    def _finish(self, outcome: Outcome, delay: float = 0.0, reason: str = "") -> None:
        # Stop taking requests at once: after a failure the next request must not overtake the failed one.
        self._stopping = True
        if not self._result.done():
            self._result.set_result(TaskResult(outcome, delay, reason))
        self._wake_waiter()

    def _wake_waiter(self) -> None:
        """Make ``_wait_for_outcome`` look again now (an outcome, or the watchdog saw pressure or a drain)."""
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _wait_for_outcome(self) -> None:
        quiet = self._rt.settings.quiescent_period
        while not self._result.done():
            # Before the consumer has caught up, a gap is slow delivery (a busy machine, flow control), not a quiet
            # change set: releasing then would only cost a re-take. Give up on it only after nats_timeout (a stalled
            # consumer; the release check hands the queued requests to a fresh activation).
            limit = quiet if self._caught_up else max(2 * quiet, self._rt.settings.nats_timeout)
            # The change set's shard moved (the layout changed, looked at every time: it may change while owned):
            # this ownership only drains the old shard, so it lets go once idle and its new shard's task goes on.
            if self._caught_up and (self._rt.pressure or draining(self._rt, self.change_set, self._names)):
                limit = min(limit, _PRESSURE_QUIET)  # others wait for a slot: an idle change set gives way
            idle = time.monotonic() - self._activity.last
            if idle < limit:
                timeout = min(limit - idle, quiet) + 0.001
            elif not self._request_lock.locked():
                self._finish(
                    Outcome.RELEASED, reason="quiescent" if limit == quiet else "others wait for a slot"
                )
                return
            else:
                # Idle for long enough, but a request is in hand (its step waits for something): look again when
                # it ends (_on_request wakes us), not in a spin until then.
                self._wake_after_request = True
                timeout = quiet
            # Look again when the limit is reached, or sooner if woken: by the outcome, or by the watchdog once
            # pressure or a drain shortens the limit (watch). It used to look every second, which with thousands
            # of owned change sets was thousands of wake-ups a second for nothing.
            self._wake = wake = asyncio.get_running_loop().create_future()
            await asyncio.wait({wake}, timeout=timeout)
            self._wake, self._wake_after_request = None, False

    async def _finish_task(self, result: TaskResult) -> TaskResult:
        settings = self._rt.settings
        self._stopping = True
        grace = (
            settings.shutdown_grace if result.outcome is Outcome.INTERRUPTED else settings.handler_deadline
        )
        # Let the request in hand finish (a wedged step was cancelled, so that one ends at once); its commit is
        # fenced anyway if we lost the change set meanwhile.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                async with self._request_lock:
                    await self._settle_group(result)
        await self._consumer.close()
        if result.outcome in (Outcome.RELEASED, Outcome.RETRY, Outcome.INTERRUPTED):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._dvu.drain()  # a DVU cut short stays due in the record (dvu_pending)
        await self._trimmer.flush(settings.nats_timeout)
        if result.outcome.hands_back:
            await self._mark_handed_back()
        if result.outcome is not Outcome.RELEASED:
            return result
        assert self._handle is not None
        return await release(self._rt, self.change_set, self._handle, self.lease, self._names)

    async def _settle_group(self, result: TaskResult) -> None:
        """Commit and answer what an open group holds, unless we no longer own the change set."""
        commits = self._commits
        if commits is None or not commits.open:
            return
        if result.outcome in (Outcome.FENCED, Outcome.LEASE_LOST):
            commits.abandon()
            return
        try:
            await commits.flush()
        except Exception as err:
            # Its requests stay in the stream and are processed again by the next owner.
            log.warning("%s: committing the last group failed: %r", self.change_set, err)

    async def _mark_handed_back(self) -> None:
        """Tell the next owner this handover is deliberate (not a crash), so it counts no attempt against the first
        queued request. Best effort: if it fails, the next owner counts one."""
        handle = self._handle
        if handle is None or not self.lease.held():
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(
                min(self._rt.settings.nats_timeout, max(0.001, self.lease.remaining()))
            ):
                async with handle.lock:
                    await handle.commit(replace(handle.record, handed_back=True))
