"""The change sets a daemon owns now: one processor each, from its task taken to the task's end.

Taking a task starts the change set's processor in a task of its own (its trace span lasts as long as the
ownership); when the processor ends, the task delivery is acked (released), nacked (handed back, with a delay for
a retry) or left alone (fenced, lease lost, stale), and the outcome counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import nats.errors
from nats.aio.msg import Msg

from rebaser_core.errors import InvalidSubject
from rebaser_core.ids import WorkspacePk
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.migration import old_shard_busy
from rebaser_server.changeset.outcome import TASK_COUNTERS
from rebaser_server.changeset.owning import Owning
from rebaser_server.changeset.processor import ChangeSetProcessor, Outcome, TaskResult
from rebaser_server.intake.admission import Admission
from rebaser_server.intake.fairness import FairShare
from rebaser_server.record.store import NothingToDo, TaskDelivery
from rebaser_server.task.delivery import Delivery

__all__ = ["OwnedChangeSets"]

log = logging.getLogger(__name__)

# A new-shard task whose change set still has work in its old shard (a layout change) is handed back for this long.
_DEFER_DELAY = 0.25
# A task whose workspace is at its share (max_owned_per_workspace) goes back to the stream for this long, doubled at
# each of its deliveries up to _FAIR_DELAY_MAX: a flood's tasks come back ever more slowly while it stays at its
# share, and each is tried again within seconds once a slot of its workspace frees.
_FAIR_DELAY = 0.1
_FAIR_DELAY_MAX = 1.0


class OwnedChangeSets:
    def __init__(self, owning: Owning, admission: Admission) -> None:
        self._owning = owning
        self._admission = admission
        self._tasks: dict[asyncio.Task[None], ChangeSetProcessor] = {}
        # Per-workspace share (fairness.py): at most so many change sets of one workspace while others have tasks.
        self.fair = FairShare(owning.nats, owning.settings, owning.placement)
        # Told of every task handed back (its shard, its workspace, the delay before it is ready again): the fair
        # intake asks for it again then (nothing is published for a task that goes back).
        self.on_handed_back: Callable[[int, WorkspacePk, float], None] | None = None
        # Hand-backs whose nak was not confirmed (lease run out, NATS trouble): the task may still be held here.
        self.unconfirmed_hand_backs = 0

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def change_sets(self) -> list[ChangeSet]:
        return [p.change_set for p in self._tasks.values()]

    def processors(self) -> list[ChangeSetProcessor]:
        return list(self._tasks.values())

    def interrupt_all(self) -> int:
        """Hand every owned change set back (each finishes the request in hand, then nacks its task); how many."""
        processors = self.processors()
        for processor in processors:
            processor.interrupt()
        return len(processors)

    async def wait(self, timeout: float) -> int:
        """Until every ownership has ended, for at most ``timeout``; how many are left."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        return len(self._tasks)

    async def take(
        self, msg: Msg, pulled_at: float, subjects: Subjects, *, share_checked: bool = False
    ) -> None:
        """Own the change set of task delivery ``msg``. ``share_checked``: the fair intake chose the task with the
        workspace's share in mind (turns.py); else a workspace at its share hands it back with a delay."""
        try:
            parsed = subjects.parse_task(msg.subject)
        except InvalidSubject as err:
            log.error("dropping malformed task %r: %s", msg.subject, err)
            await msg.term()
            return
        stats = self._owning.report.stats
        heartbeat = self._owning.heartbeat
        if heartbeat is not None and not heartbeat.held():
            # lease_mode daemon, and this daemon's heartbeat lapsed: it could hold the task under no generation. A
            # fresh delivery, never acted on, so its nak can take it from nobody: back for another daemon, after a
            # progress period (at once, it would come straight back to a pull of this daemon still open).
            with contextlib.suppress(Exception):
                await msg.nak(delay=self._owning.settings.progress_period)
            return
        if not share_checked and self.fair.must_wait(parsed.workspace_id):
            # Its workspace has its share here: back to the stream, not lost, tried again after a delay (growing with
            # each delivery), while other workspaces' tasks are taken meanwhile.
            settings = self._owning.settings
            if time.monotonic() - pulled_at < settings.ack_wait - settings.lease_margin:
                # (A delivery older than that may be another daemon's by now: left alone, it comes back by itself.)
                stats.tasks_deferred_fair_share += 1
                delivered = Delivery.of(msg).delivered
                await msg.nak(delay=min(_FAIR_DELAY * 2 ** min(delivered - 1, 16), _FAIR_DELAY_MAX))
            return
        stats.tasks_taken += 1
        change_set = ChangeSet(parsed.workspace_id, parsed.change_set_id, self._owning.reader)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: took task delivery %s", change_set, TaskDelivery.of(msg))
        processor = ChangeSetProcessor(
            self._owning,
            change_set,
            msg,
            pulled_at=pulled_at,
            subjects=subjects,
            on_started=self._admission.started,
        )
        self._admission.taken(processor)
        # The take's trace span lasts as long as the task (rebaser_server.ops.observe).
        task = self._owning.report.observe.own(
            change_set, lambda: asyncio.create_task(self._own(processor), name=f"change set {change_set}")
        )
        self._tasks[task] = processor
        self.fair.taken(parsed.workspace_id)
        self._owning.placement.owned = len(self._tasks)

    async def _own(self, processor: ChangeSetProcessor) -> None:
        stats = self._owning.report.stats
        try:
            try:
                # Order across a layout change: what is queued in the change set's old shard goes first.
                owning = self._owning
                busy = await old_shard_busy(
                    owning.nats,
                    owning.settings,
                    owning.placement.layout,
                    processor.change_set,
                    processor.subjects,
                )
                if busy is not None:
                    stats.tasks_deferred += 1
                    result = TaskResult(Outcome.RETRY, _DEFER_DELAY, busy)
                else:
                    result = await processor.run()
            except NothingToDo:
                # An empty task (no request queued, no record): taking it would create a record nothing removes.
                stats.tasks_dropped += 1
                await processor.lease.term()
                return
            except (TimeoutError, nats.errors.Error) as err:
                # NATS trouble (a leader election, an outage): expected in operation, one line, no traceback.
                log.warning("%s: task failed on NATS (%r); it will be retried", processor.change_set, err)
                result = TaskResult(Outcome.RETRY, self._owning.settings.retry_backoff, str(err))
            except Exception as err:
                log.exception("%s: task failed", processor.change_set)
                result = TaskResult(Outcome.RETRY, self._owning.settings.retry_backoff, str(err))
            log.debug("%s: task %s (%s)", processor.change_set, result.outcome.value, result.reason)
            outcome = result.outcome
            if outcome.hands_back:
                # Only while the lease is held: a late nak would take the task from the daemon that has it now.
                delay = result.delay if outcome is Outcome.RETRY else None
                # The nak is tried again while the lease holds; if the heartbeat lapsed meanwhile (the same trouble
                # as the reconnect that made this hand-back, often), while the delivery's own lease holds.
                if not await processor.lease.nak(delay=delay):
                    if await processor.hand_back_after_lapse():
                        stats.lapse_hand_backs += 1
                    else:
                        self.unconfirmed_hand_backs += 1
                if self.on_handed_back is not None:
                    self.on_handed_back(
                        processor.subjects.shard, processor.change_set.workspace_id, delay or 0.0
                    )
            elif outcome is Outcome.LEASE_LOST and await processor.hand_back_after_lapse():
                stats.lapse_hand_backs += 1
                log.info("%s: handed back (this daemon's heartbeat lapsed)", processor.change_set)
                # Nothing is published for a task handed back: its peers (the fair intake's turns) would find it only
                # at their next look, half the long task_ack_wait away. A task publish, refused since the task
                # exists, is seen by every daemon's watch all the same: its workspace joins their lines now.
                with contextlib.suppress(Exception):
                    change_set = processor.change_set
                    task = processor.subjects.task(change_set.workspace_id, change_set.change_set_id)
                    await self._owning.nats.nc.publish(task, b"")
                if self.on_handed_back is not None:
                    self.on_handed_back(processor.subjects.shard, processor.change_set.workspace_id, 0.0)
            counter = TASK_COUNTERS[outcome]
            setattr(stats, counter, getattr(stats, counter) + 1)
        finally:
            self._tasks.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
            self.fair.ended(processor.change_set.workspace_id)
            self._owning.placement.owned = len(self._tasks)
            # Ended before it started (stale, lease lost, NATS trouble), or after: either way a slot is free.
            self._admission.started(processor)
