"""One change set, owned: consume its requests in order, one at a time, then release it safely.

Life of a task (the daemon holds the change set's task message for all of it):

1. **Acquire**: bump the record's epoch (fences every earlier owner), start the keep-alive and the DVU loop.
2. **Consume**: an ordered push consumer on the change set's request subject; its callback handles one request
   at a time (nats-py awaits a subscription's callback before delivering the next message).
3. **Finish** with one outcome: quiet for ``quiescent_period`` -> release; retryable failure -> nack with backoff;
   shutdown -> nack now; fenced -> walk away; wedged (a step over ``handler_deadline``) -> nack.
4. **Release** (design-notes §3, the quiescence race): stop consuming, finish the DVU, ack the task, and only then
   ask "is any request still queued?". A request published before the ack either made its client's task publish
   fail (a task still existed) and is seen by that check, or its task publish comes after the ack and succeeds.
   Either way it gets a task; no window strands it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import nats.errors
from nats.aio.msg import Msg
from nats.js import api as js_api

from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    ErrorStatus,
)
from rebaser_core.errors import FencedError, ProtocolError, UnprocessableError
from rebaser_core.tasks import publish_task
from rebaser_server.app import ChangeSet
from rebaser_server.dvu import SerialDvu
from rebaser_server.group import CommitGroup
from rebaser_server.replies import dead_letter, reply_inbox, request_id_of
from rebaser_server.runtime import Runtime
from rebaser_server.state import ChangeSetHandle, ChangeSetRecord
from rebaser_server.trimmer import Trimmer

__all__ = ["ChangeSetProcessor", "Outcome", "TaskResult"]

log = logging.getLogger(__name__)
T = TypeVar("T")


# A commit group is committed when nothing more is waiting, when it holds this many requests, or after this long.
# Its size is also capped at half the idempotency window (see Trimmer: every processed request still in the
# stream must stay within the window).
_GROUP_MAX = 32
_GROUP_MAX_WAIT = 0.005

_BACKGROUND: set[asyncio.Task[Any]] = set()


def _in_background(coro: Coroutine[Any, Any, Any]) -> None:
    task = asyncio.create_task(coro)
    _BACKGROUND.add(task)  # keep a reference until done, or the task may be garbage-collected mid-flight

    def done(t: asyncio.Task[Any]) -> None:
        _BACKGROUND.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.debug("background cleanup failed: %s", t.exception())

    task.add_done_callback(done)


class Outcome(enum.Enum):
    RELEASED = "released"  # quiet: task acked
    RETRY = "retry"  # retryable failure: nack with delay
    INTERRUPTED = "interrupted"  # shutdown: nack now
    FENCED = "fenced"  # another daemon owns it: neither ack nor nack
    WEDGED = "wedged"  # a step overran handler_deadline: nack now


@dataclass(frozen=True, slots=True)
class TaskResult:
    outcome: Outcome
    delay: float = 0.0
    reason: str = ""


class _Retry(Exception):
    def __init__(self, delay: float, reason: str) -> None:
        super().__init__(reason)
        self.delay = delay


class _Wedged(Exception):
    pass


class ChangeSetProcessor:
    def __init__(self, rt: Runtime, change_set: ChangeSet, task_msg: Msg) -> None:
        self._rt = rt
        self.change_set = change_set
        self._task_msg = task_msg
        self._subject = rt.subjects.requests(change_set.workspace_id, change_set.change_set_id)
        self._result: asyncio.Future[TaskResult] = asyncio.get_running_loop().create_future()
        self._stopping = False
        # Held while one request is processed; release takes it to wait for the request in hand.
        self._request_lock = asyncio.Lock()
        self._handle: ChangeSetHandle | None = None
        self._sub: Any = None
        self._consumer: str | None = None
        self._caught_up = False
        # Set while no request is waiting: a due DVU runs in a lull, so a burst of requests shares few DVU runs.
        self._lull = asyncio.Event()
        self._lull.set()
        self._last_activity = time.monotonic()
        # Watchdog state: when the running step (an apply or a DVU) began, and the task running it.
        self._steps: dict[asyncio.Task[Any], float] = {}
        self._wedged = False
        self._trimmer = Trimmer(rt, self._subject)
        self._commits: CommitGroup | None = None  # created once the change set's record is acquired
        self._flush_timer: asyncio.Task[None] | None = None
        self._dvu = SerialDvu(self._run_dvu, name=f"dvu {change_set}")

    # -- public -------------------------------------------------------------------------------------
    def interrupt(self) -> None:
        """Graceful shutdown: finish the request in hand (bounded), then hand the task back."""
        self._finish(Outcome.INTERRUPTED, reason="shutdown")

    async def run(self) -> TaskResult:
        rt = self._rt
        try:
            self._handle = await rt.store.acquire(
                self.change_set, rt.owner, rt.app.initial_state(self.change_set)
            )
        except FencedError as err:
            return TaskResult(Outcome.RETRY, rt.settings.retry_backoff, str(err))
        self._commits = CommitGroup(rt, self.change_set, self._handle, self._trimmer, self._dvu.notify)
        keepalive = asyncio.create_task(self._keepalive(), name=f"keepalive {self.change_set}")
        try:
            await rt.hooks.checkpoint("acquired", self.change_set)
            self._dvu.start()
            if self._handle.record.dvu_pending:
                self._dvu.notify()  # the previous owner died with a DVU due
            await self._subscribe()
            if self._caught_up:
                # Nothing queued (a redelivered or swept task): release at once. Safe for the same reason every
                # release is: a request published meanwhile is found by the check after the ack.
                self._finish(Outcome.RELEASED, reason="nothing queued")
            await self._wait_for_outcome()
            return await self._finish_task(self._result.result())
        finally:
            keepalive.cancel()
            await self._dvu.stop()
            await self._unsubscribe()

    # -- consuming ----------------------------------------------------------------------------------
    async def _subscribe(self) -> None:
        js = self._rt.js
        config = js_api.ConsumerConfig(
            filter_subject=self._subject,
            deliver_policy=js_api.DeliverPolicy.ALL,
            deliver_subject=self._rt.nc.new_inbox(),
            ack_policy=js_api.AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=5.0,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=max(30.0, self._rt.settings.ack_wait),
        )
        # add_consumer + subscribe_bind (not js.subscribe) keeps the consumer's name and num_pending.
        info = await js.add_consumer(self._rt.subjects.requests_stream, config)
        self._consumer = info.name
        self._caught_up = (info.num_pending or 0) == 0
        if not self._caught_up:
            self._lull.clear()
        self._sub = await js.subscribe_bind(
            self._rt.subjects.requests_stream, config, info.name, cb=self._on_request, ordered_consumer=True
        )

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is None:
            return
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        # Unsubscribing leaves the server-side consumer until the server reaps it; delete it so the consumer
        # count tracks active change sets. After a reset the ordered consumer has a new name.
        name = getattr(sub, "_consumer", None) or self._consumer
        if name:
            # Off the critical path: nothing waits for it (and the server reaps it anyway if this fails).
            _in_background(self._rt.js.delete_consumer(self._rt.subjects.requests_stream, name))

    async def _on_request(self, msg: Msg) -> None:
        if self._stopping:
            return  # left in the stream: the release check or the next owner will see it
        async with self._request_lock:
            if self._stopping:
                return
            try:
                await self._process(msg)
            except Exception as err:
                self._fail(err)
            finally:
                self._last_activity = time.monotonic()
                pending = msg.metadata.num_pending if msg.reply else None
                self._caught_up = pending == 0
                if self._caught_up:
                    self._lull.set()
                else:
                    self._lull.clear()

    def _fail(self, err: Exception) -> None:
        """End the task after a failure while processing; an open commit group is settled by ``_finish_task``."""
        if isinstance(err, FencedError):
            self._finish(Outcome.FENCED, reason=str(err))
        elif isinstance(err, _Retry):
            self._finish(Outcome.RETRY, err.delay, str(err))
        elif isinstance(err, _Wedged):
            self._finish(Outcome.WEDGED, reason="request handler overran handler_deadline")
        else:
            # Infrastructure trouble (NATS, KV): the request stays first in line; retry the task later.
            if isinstance(err, nats.errors.Error | TimeoutError):
                log.warning("%s: NATS trouble while processing a request: %r", self.change_set, err)
            else:
                log.error("%s: processing a request failed", self.change_set, exc_info=err)
            self._finish(Outcome.RETRY, self._rt.settings.retry_backoff, f"{type(err).__name__}: {err}")

    async def _process(self, msg: Msg) -> None:
        rt = self._rt
        assert self._handle is not None
        seq = msg.metadata.sequence.stream
        headers = msg.headers or {}
        try:
            reply_inbox(rt, headers)  # an inbox we may not publish to refuses the request (InvalidReplyInbox)
            request = ENQUEUE_UPDATES_REQUEST.decode(headers, msg.data)
            if (request.workspace_id, request.change_set_id) != (
                self.change_set.workspace_id,
                self.change_set.change_set_id,
            ):
                raise UnprocessableError(
                    f"request for {request.workspace_id}/{request.change_set_id} was "
                    f"published on {msg.subject}"
                )
        except (ProtocolError, UnprocessableError) as err:
            # Undecodable or not ours: never blocks the change set. Dead-letter it; the error reply (and its removal
            # from the stream) go out with the group, so a purge never runs ahead of an uncommitted group.
            reason = f"{type(err).__name__}: {err}"
            await dead_letter(rt, msg, seq, reason)
            group = await self._group()
            group.stage(seq, headers, self._error_response(headers, reason))
            await self._maybe_flush(msg)
            return

        group = await self._group()
        response = group.base.reply_for(request)
        if response is not None:
            rt.stats.requests_replayed += 1
            group.stage(seq, headers, response)
        else:
            response, record, dvu = await self._apply(group, request, msg, seq)
            group.stage(seq, headers, response, record, dvu=dvu, applied=True)
        await self._maybe_flush(msg)

    async def _group(self) -> CommitGroup:
        """The open commit group (opened now if none): it holds the commit lock until flushed."""
        assert self._commits is not None
        await self._commits.begin()
        return self._commits

    async def _maybe_flush(self, msg: Msg) -> None:
        """Commit now unless more requests are already waiting and the group has room (then soon, by timer)."""
        assert self._commits is not None
        waiting = msg.metadata.num_pending if msg.reply else 0
        if not waiting or len(self._commits) >= min(_GROUP_MAX, self._rt.settings.idempotency_window // 2):
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

    async def _apply(
        self, group: CommitGroup, request: EnqueueUpdatesRequest, msg: Msg, seq: int
    ) -> tuple[EnqueueUpdatesResponse, ChangeSetRecord, bool]:
        """Apply one request to the group's record; return its reply, the record to stage and whether a DVU is due.
        A retryable failure commits the group with the attempt counted, then raises ``_Retry``."""
        rt, settings, record, rid = self._rt, self._rt.settings, group.base, str(request.id)
        try:
            applied = await self._step(rt.app.apply(self.change_set, record.state, request))
        except UnprocessableError as err:
            reason = f"unprocessable: {err}"
        except FencedError:
            raise
        except Exception as err:  # RetryableError, a wedged step, or any bug in the app: up to max_attempts
            attempts = record.attempts.get(rid, 0) + 1
            if attempts < settings.max_attempts:
                # Not its sequence: the failed request must stay in the stream, first in line.
                group.stage(0, {}, None, replace(record, attempts={**record.attempts, rid: attempts}))
                await group.flush()  # what came before is answered; this request stays first in line
                rt.stats.requests_retried += 1
                if isinstance(err, _Wedged):
                    raise
                delay = min(settings.retry_backoff * 2 ** (attempts - 1), settings.retry_backoff_max)
                raise _Retry(delay, f"attempt {attempts} of request {rid} failed: {err}") from err
            reason = f"gave up after {attempts} attempts: {type(err).__name__}: {err}"
        else:
            response = EnqueueUpdatesResponse(
                id=request.id,
                workspace_id=request.workspace_id,
                change_set_id=request.change_set_id,
                status=applied.status,
            )
            updated = record.with_reply(rid, response, settings.idempotency_window)
            staged = replace(updated, state=applied.state, dvu_pending=record.dvu_pending or applied.dvu)
            return response, staged, applied.dvu
        # Permanent failure: record the error reply (so a redelivery is answered, not re-run), then dead-letter.
        response = EnqueueUpdatesResponse(
            id=request.id,
            workspace_id=request.workspace_id,
            change_set_id=request.change_set_id,
            status=ErrorStatus(message=reason, retryable=False),
        )
        await dead_letter(rt, msg, seq, reason)
        return response, record.with_reply(rid, response, settings.idempotency_window), False

    def _error_response(self, headers: dict[str, str], reason: str) -> EnqueueUpdatesResponse:
        return EnqueueUpdatesResponse(
            id=request_id_of(headers),
            workspace_id=self.change_set.workspace_id,
            change_set_id=self.change_set.change_set_id,
            status=ErrorStatus(message=reason, retryable=False),
        )

    # -- dependent values update --------------------------------------------------------------------
    async def _run_dvu(self) -> None:
        handle = self._handle
        assert handle is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._lull.wait(), self._rt.settings.dvu_max_delay)
        try:
            async with handle.lock:
                record = handle.record
                state = await self._step(self._rt.app.dependent_values_update(self.change_set, record.state))
                await handle.commit(replace(handle.record, state=state, dvu_pending=False))
            self._rt.stats.dvu_runs += 1
        except FencedError as err:
            self._finish(Outcome.FENCED, reason=str(err))
        except _Wedged:
            self._finish(Outcome.WEDGED, reason="dependent values update overran handler_deadline")
        except Exception:
            self._rt.stats.dvu_failures += 1
            raise

    # -- watchdog and keep-alive --------------------------------------------------------------------
    async def _step(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one app step in its own task so the watchdog can cancel it if it wedges."""
        task = asyncio.ensure_future(coro)
        self._steps[task] = time.monotonic()
        try:
            return await task
        except asyncio.CancelledError:
            if self._wedged and task.cancelled():
                raise _Wedged() from None
            raise
        finally:
            self._steps.pop(task, None)

    async def _keepalive(self) -> None:
        """Progress acks while the work is alive; give the task up if a step wedges."""
        settings = self._rt.settings
        while True:
            await asyncio.sleep(settings.progress_period)
            now = time.monotonic()
            if any(now - started > settings.handler_deadline for started in self._steps.values()):
                log.error(
                    "%s: a step overran handler_deadline (%.1fs); giving the task up",
                    self.change_set,
                    settings.handler_deadline,
                )
                self._wedged = True
                self._finish(Outcome.WEDGED, reason="handler_deadline exceeded")
                for task in list(self._steps):
                    task.cancel()
                return
            with contextlib.suppress(Exception):
                await self._task_msg.in_progress()

    # -- finishing ----------------------------------------------------------------------------------
    def _finish(self, outcome: Outcome, delay: float = 0.0, reason: str = "") -> None:
        # Stop taking requests at once: after a failure the next request must not overtake the failed one.
        self._stopping = True
        if not self._result.done():
            self._result.set_result(TaskResult(outcome, delay, reason))

    async def _wait_for_outcome(self) -> None:
        quiet = self._rt.settings.quiescent_period
        while not self._result.done():
            # Before the consumer has caught up, a gap may just be slow delivery: wait twice as long.
            limit = quiet if self._caught_up else 2 * quiet
            idle = time.monotonic() - self._last_activity
            if idle >= limit and not self._request_lock.locked():
                self._finish(Outcome.RELEASED, reason="quiescent")
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._result), timeout=limit - idle + 0.001)

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
        await self._unsubscribe()
        if result.outcome in (Outcome.RELEASED, Outcome.RETRY, Outcome.INTERRUPTED):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._dvu.drain()  # a DVU cut short stays due in the record (dvu_pending)
        await self._trimmer.flush(settings.ack_wait)
        if result.outcome is not Outcome.RELEASED:
            return result
        return await self._release()

    async def _settle_group(self, result: TaskResult) -> None:
        """Commit and answer what an open group holds, unless we no longer own the change set."""
        commits = self._commits
        if commits is None or not commits.open:
            return
        if result.outcome is Outcome.FENCED:
            commits.abandon()
            return
        try:
            await commits.flush()
        except Exception as err:
            # Its requests stay in the stream and are processed again by the next owner.
            log.warning("%s: committing the last group failed: %r", self.change_set, err)

    async def _release(self) -> TaskResult:
        rt = self._rt
        assert self._handle is not None
        if not await self._handle.still_owner():
            # Acking now could delete the task of the daemon that took over (a late ack is still accepted).
            return TaskResult(Outcome.FENCED, reason="lost ownership before release")
        await rt.hooks.checkpoint("stopped_consuming", self.change_set)
        await self._task_msg.ack_sync(timeout=rt.settings.ack_wait)
        await rt.hooks.checkpoint("task_acked", self.change_set)
        if await rt.queued(self.change_set):
            # Published while we were letting go: make sure it has a task (refused if its client made one).
            created = await publish_task(
                rt.nc, rt.subjects.task(self.change_set.workspace_id, self.change_set.change_set_id)
            )
            log.info(
                "%s: request arrived during release; task %s",
                self.change_set,
                "republished" if created else "already present",
            )
        return TaskResult(Outcome.RELEASED, reason="quiescent")
