"""A change set whose record cannot be read is quarantined: paused (cause ``record_unreadable``), not retried for ever.

The record (``rebaser_server.record``) is the change set's state, its ownership epoch, the watermark of what was
applied and the replies already given. When it holds bytes that do not decode (a bug, or someone with write access
to the bucket), retrying cannot help: every take would read the same garbage, log a traceback and hand the task
back, for ever, spending a slot and the log. So the first daemon to find it pauses the change set instead, as an
operator would (:mod:`rebaser_core.pauses`), and says so once:

- its requests stay queued, in order, and new ones are still accepted: nothing is lost, and nothing is answered
  either. The record is what says which requests were applied already and what they were answered, so without it no
  reply (not even an error) can be trusted; callers wait within their own timeout, as for any pause;
- no daemon takes it again until it is repaired: ``rebaser change-set reset-record WK CS`` deletes the record and
  resumes it, and the change set starts over from the app's initial state (``rebaser_client.admin.store_repairs``);
- ``rebaser status``, the web console and ``/status`` name it with that command; ``rebaser_records_unreadable_total``
  and ``rebaser_pauses_total{cause="record_unreadable"}`` count it.

If the pause cannot be stored (NATS trouble) the task is retried with backoff, as for any NATS failure.
"""

from __future__ import annotations

import logging

from rebaser_core.errors import DecodeError
from rebaser_core.pauses import Pause, repair_command
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.outcome import Outcome, TaskResult
from rebaser_server.changeset.owning import Owning
from rebaser_server.changeset.release import resumed_meanwhile
from rebaser_server.task.lease import Lease

__all__ = ["quarantine"]

log = logging.getLogger(__name__)


async def quarantine(
    change_set: ChangeSet, lease: Lease, err: DecodeError, subjects: Subjects, owning: Owning
) -> TaskResult:
    """Pause ``change_set`` (its record is unreadable: ``err``), then let its task go as a paused one's."""
    settings, report = owning.settings, owning.report
    wk, cs = change_set.workspace_id, change_set.change_set_id
    pause = Pause.now("record_unreadable", f"its record cannot be read: {err}")
    repair = repair_command(pause, wk, cs)
    try:
        await owning.pauses.pause(change_set, pause)
    except Exception as store_err:  # not stored: retried like any NATS failure, the request first in line
        log.warning("%s: record unreadable, and storing its quarantine failed (%r)", change_set, store_err)
        return TaskResult(Outcome.RETRY, settings.retry_backoff, f"quarantine not stored: {store_err!r}")
    report.stats.records_unreadable += 1
    log.error(
        "%s: quarantined (paused): its record cannot be read (%s); its requests stay queued and no daemon takes it "
        "until it is repaired: %s",
        change_set,
        err,
        repair,
    )
    if lease.held():  # else another daemon may hold the task now: acking would take it from it
        await lease.ack(timeout=settings.nats_timeout)
        # Repaired already (the pause deleted before this ack): the release's check gives the queue a task.
        await resumed_meanwhile(
            change_set, subjects, pauses=owning.pauses, nats=owning.nats, settings=settings, report=report
        )
    return TaskResult(Outcome.PAUSED, reason=f"quarantined: {pause.reason}")
