"""Letting a quiet change set go: ack the task, then make sure nothing queued is left without one.

The order is the whole point (the quiescence race): the task is acked *first*, and only then is the stream asked
"is any request of this change set still queued?". A request published before the ack made its client's task
publish fail (a task still existed), so this check sees it and publishes a task for it; one published after the
ack has its own task. The check reads from the stream leader (by direct get only where nobody else can answer
one, rebaser_server.record.direct_reads: a lagging replica may miss the request) and is retried, with the task publish,
for up to ``nats_timeout``: giving up here leaves the request to the orphan sweep (one ``sweep_interval`` at
worst), so it is worth trying hard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace

from rebaser_core.nats.tasks import publish_task
from rebaser_core.pauses import Pause
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.context import Nats, Pauses, Report
from rebaser_server.changeset.events import ChangeSetFeed
from rebaser_server.changeset.outcome import Outcome, TaskResult
from rebaser_server.record.handle import ChangeSetHandle
from rebaser_server.task.lease import Lease

__all__ = ["let_go_paused", "mark_handed_back", "release", "resumed_meanwhile"]

log = logging.getLogger(__name__)

_RETRY_PAUSE = 0.1


async def release(
    change_set: ChangeSet,
    handle: ChangeSetHandle,
    lease: Lease,
    subjects: Subjects,
    *,
    nats: Nats,
    settings: Settings,
    report: Report,
) -> TaskResult:
    """Let go of ``change_set`` (owned from the shard ``subjects``): ack its task, then make sure a request queued
    meanwhile has one."""
    if not await handle.still_owner():
        # Acking now could delete the task of the daemon that took over (a late ack is still accepted).
        return TaskResult(Outcome.FENCED, reason="lost ownership before release")
    await report.hooks.checkpoint("stopped_consuming", change_set)
    if not await lease.ack(timeout=settings.nats_timeout):
        if await lease.hand_back_after_lapse(handle.claim_after_lapse):  # False unless the heartbeat lapsed
            # The heartbeat lapsed (a freeze) after the change set went quiet: the task is still this delivery's,
            # and no peer reaps a daemon whose heartbeat is back. Unacked, it would hold the requests queued since
            # for task_ack_wait; handed back, it is delivered again at once.
            report.stats.lapse_hand_backs += 1
            log.info("%s: handed back at release (this daemon's heartbeat lapsed)", change_set)
        else:
            # Not sent (the lease ran out) or not confirmed: the task may or may not still exist. The check below
            # is still right either way: a task publish while one exists is refused, which is harmless.
            log.warning("%s: release ack not confirmed; checking for queued requests anyway", change_set)
    await report.hooks.checkpoint("task_acked", change_set)
    await _task_for_queued(nats, settings.nats_timeout, report, change_set, subjects)
    return TaskResult(Outcome.RELEASED, reason="quiescent")


async def _task_for_queued(
    nats: Nats, timeout: float, report: Report, change_set: ChangeSet, subjects: Subjects
) -> None:
    """If a request of the change set is still queued in the shard it was owned from, make sure it has a task
    there (retried within nats_timeout)."""
    task = subjects.task(change_set.workspace_id, change_set.change_set_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            if await nats.queued(change_set, subjects=subjects, timeout=timeout):
                created = await publish_task(
                    nats.nc, task, timeout=max(0.1, deadline - loop.time()), requester=nats.requester
                )
                log.info(
                    "%s: request arrived during release; task %s",
                    change_set,
                    "republished" if created else "already present",
                )
            return
        except Exception as err:  # NATS trouble of any kind (RebaserError, NotFoundError, timeouts)
            if loop.time() >= deadline:
                report.stats.release_checks_failed += 1
                log.warning(
                    "%s: checking for requests queued during release failed (%s); the orphan sweep will find them",
                    change_set,
                    err,
                )
                return
            await asyncio.sleep(_RETRY_PAUSE)


async def mark_handed_back(handle: ChangeSetHandle | None, lease: Lease, timeout: float) -> None:
    """Tell the change set's next owner that this hand-back is deliberate (not a crash), so it counts no attempt
    against the first queued request. Best effort, while the lease holds and for at most ``timeout``: if it fails,
    the next owner counts one."""
    if handle is None or not lease.held():
        return
    with contextlib.suppress(Exception):
        async with asyncio.timeout(min(timeout, max(0.001, lease.remaining()))):
            async with handle.lock:
                await handle.refresh_after_lost_write()
                await handle.commit(replace(handle.record, handed_back=True))


async def let_go_paused(
    change_set: ChangeSet,
    lease: Lease,
    *,
    pauses: Pauses,
    decided: Pause | None,
    feed: ChangeSetFeed,
    subjects: Subjects,
    nats: Nats,
    settings: Settings,
    report: Report,
    result: TaskResult,
) -> TaskResult:
    """Let a paused change set go: store the pause this ownership ``decided`` (a request failed max_attempts
    times), say released, then ack the task *without* the release's "anything queued?" check: the queue waits for
    the resume, which gives the change set a task again."""
    if decided is not None:
        try:
            await pauses.pause(change_set, decided)
        except Exception as err:  # not stored: the request stays first and fails again later
            log.warning("%s: storing the pause failed (%r); retrying the task", change_set, err)
            return TaskResult(Outcome.RETRY, settings.retry_backoff, f"pause not stored: {err!r}")
        log.error("%s: paused: %s", change_set, decided.reason)
        await feed.notice("paused", reason=decided.cause, request_id=decided.request_id)
    await feed.released(Outcome.PAUSED.value)
    if lease.held():  # else another daemon may hold the task now: acking would take it from it
        await lease.ack(timeout=settings.nats_timeout)
        await resumed_meanwhile(
            change_set, subjects, pauses=pauses, nats=nats, settings=settings, report=report
        )
    return result


async def resumed_meanwhile(
    change_set: ChangeSet,
    subjects: Subjects,
    *,
    pauses: Pauses,
    nats: Nats,
    settings: Settings,
    report: Report,
) -> None:
    """After a paused change set's task is acked: if the pause is gone by now, the release's "anything queued?"
    check. A resume deletes the key, then publishes a task: refused if it came before this ack (the task still
    existed), and then this read, after the ack, sees the key gone. Still paused: the resume gives the task."""
    try:
        if await pauses.holding(change_set) is not None:
            return
    except Exception as err:  # NATS trouble: the orphan sweep finds what is queued
        log.warning("%s: reading its pause after letting it go failed (%r)", change_set, err)
        return
    await _task_for_queued(nats, settings.nats_timeout, report, change_set, subjects)
