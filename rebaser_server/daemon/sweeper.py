"""The orphan sweep: every queued request must have a task.

A request can be left without a task if its client died between publishing the request and the task, or if a task
publish failed for any other reason. Every ``sweep_interval`` (with jitter, so daemons spread out) the sweeper
lists the change sets that have queued requests and those that have a task, and publishes a task for each
difference. That bounds how long any request can be stranded to about one interval. Two stream-info calls per
sweep; nothing per request. Messages on malformed subjects, which nobody will ever consume, are removed
(``junk.py``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from rebaser_core.errors import InvalidSubject, RebaserError
from rebaser_core.nats import cancellation
from rebaser_core.nats.listing import stream_subjects
from rebaser_core.nats.tasks import publish_task
from rebaser_core.pauses import Pause
from rebaser_core.settings import Settings
from rebaser_core.subject_parsing import ParsedSubject
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.context import Nats, Placement
from rebaser_server.changeset.replies import Replies
from rebaser_server.daemon.batch_sweep import BatchSweeper
from rebaser_server.daemon.junk import JunkRemover

__all__ = ["Sweeper"]

log = logging.getLogger(__name__)


def _parse_all(
    parse: Callable[[str], ParsedSubject], names: dict[str, int] | None
) -> tuple[set[ParsedSubject], dict[str, str]]:
    """The change sets named by well-formed subjects, and the malformed subjects with why."""
    parsed, malformed = set(), {}
    for name in names or {}:
        try:
            parsed.add(parse(name))
        except InvalidSubject as err:
            malformed[name] = str(err)
    return parsed, malformed


class Sweeper:
    def __init__(
        self,
        nats: Nats,
        settings: Settings,
        placement: Placement,
        replies: Replies,
        *,
        paused: Callable[[ChangeSet], Pause | None] = lambda _: None,
    ) -> None:
        self._nats = nats
        self._settings = settings
        self._placement = placement  # the shard layout, as the daemon follows it: every shard is swept
        self.sweeps = 0
        self.orphans_found = 0
        self.junk = JunkRemover(nats.js, replies)
        # The stored batches' per-workspace share and unfinished batches, every stored_batches_sweep_interval.
        self.batches = BatchSweeper(nats.js, settings, replies.stats, self.junk)
        self._paused = paused
        # The loop's own stop flag: nats-py's request (asyncio.wait_for) can swallow a cancellation on Python 3.11,
        # and a sweep loop stopped only by it would go on sweeping after its daemon stopped.
        self._stopped = False

    def stop(self) -> None:
        """End ``run`` after the sweep in hand (call before cancelling it)."""
        self._stopped = True

    async def sweep_once(self) -> int:
        """Publish a task for every change set with queued requests and no task, in every shard (each shard's
        requests get their task in the same shard); return how many."""
        found = 0
        failed: Exception | None = None
        for shard in self._placement.layout.shards:
            try:
                found += await self._sweep_shard(self._settings.subjects.for_shard(shard))
            except (
                Exception
            ) as err:  # one shard's trouble (its leader being elected) must not skip the others
                log.warning("orphan sweep of shard %d failed: %s", shard, err)
                failed = err
        self.sweeps += 1
        self.orphans_found += found
        if found:
            log.warning("orphan sweep: published tasks for %d change sets with queued requests", found)
        if failed is not None:
            raise failed
        return found

    async def _sweep_shard(self, subjects: Subjects) -> int:
        js = self._nats.js
        requests = await stream_subjects(js, subjects.requests_stream, subjects.requests_all)
        queued, junk = _parse_all(subjects.parse_requests, requests)
        if junk:
            await self.junk.remove(subjects.requests_stream, junk, dead_letter=True)
        tasks = await stream_subjects(js, subjects.tasks_stream, subjects.tasks_all)
        tasked, junk = _parse_all(subjects.parse_task, tasks)
        if junk:
            await self.junk.remove(subjects.tasks_stream, junk, dead_letter=False)
        found = 0
        for change_set in sorted(queued - tasked, key=str):
            if self._paused(ChangeSet(change_set.workspace_id, change_set.change_set_id)) is not None:
                continue  # paused: its queue waits for the resume, which gives it a task
            if await self._publish(subjects, change_set):
                found += 1
        return found

    async def _publish(self, subjects: Subjects, change_set: ParsedSubject) -> bool:
        subject = subjects.task(change_set.workspace_id, change_set.change_set_id)
        try:
            return await publish_task(self._nats.nc, subject)
        except RebaserError as err:
            log.warning("orphan sweep: task publish for %s failed: %s", subject, err)
            return False

    async def run(self) -> None:
        interval = self._settings.sweep_interval
        while not self._stopped:
            await cancellation.sleep(interval * random.uniform(0.75, 1.25))
            if self._stopped:
                return
            try:
                await self.sweep_once()
            except Exception:
                log.exception("orphan sweep failed; trying again next interval")
            if self._stopped or not self.batches.due():
                continue
            try:
                await self.batches.sweep_once()
            except Exception:
                log.exception("batch sweep failed; trying again next interval")
