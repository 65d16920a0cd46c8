"""Workspaces new to a daemon's fair intake: checked for work before a consumer is made for them.

A task's publish makes its workspace join the line, whoever published it. Anyone able to publish tasks could send
them for made-up workspaces, and each would cost a durable consumer (about 50 kB of nats-server memory and a
creation of milliseconds: docs/capacity.md) and a turn ahead of real work. So the fair intake hands a workspace it
has no consumer for to :class:`Newcomers`, which checks it off the turn loop, the workspaces waiting for a check
all at once (one read each, or, for many, one read of which workspaces have requests):

- **a request of it is queued** (its last request, as the stream leader has it): its consumer is made (or found),
  and it goes to the front of the line, since its turn came while it was checked;
- **none, but its consumer exists**: a daemon may hold its tasks; it is served as usual;
- **neither** (and the layout is not changing): its tasks are empty, and nobody holds one (only its consumer hands
  them out). They are purged, up to the stream's last sequence read *before* the check, so a task published since
  is kept. A request stored meanwhile may have found its task among them (refused as a duplicate): checked once
  more after the purge, any queued change set of the workspace gets its task again, as a release does. That look
  is tried again (with backoff) until it is done, also after a purge whose answer was lost: a request left without
  its task would otherwise wait for the orphan sweep. A purge that removed nothing may have read the stream's last
  sequence before the stream stored the task the daemon heard: if a task of the workspace is there after it, the
  workspace is checked once more.

What remains: another daemon that makes the workspace's consumer between this daemon's check and its purge (for a
request stored in that moment) may take a task the purge then removes; the task published again goes to a second
owner, and the record's fence (an epoch compare-and-set) stops the first at its next commit. Nothing is applied
twice. It needs a made-up task of the very change set a real request arrives for, in that moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from nats.js.errors import NotFoundError

from rebaser_core.errors import InvalidSubject
from rebaser_core.ids import WorkspacePk
from rebaser_core.nats.requester import js_api
from rebaser_core.nats.tasks import publish_task
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.changeset.context import Nats, Placement

__all__ = ["Newcomers"]

log = logging.getLogger(__name__)

# Up to this many workspaces waiting for a check: one read each. More: one read of the requests stream's subjects
# (which workspaces have requests), if it lists at most _SUBJECTS_PER_CHECK subjects per workspace checked.
_ONE_BY_ONE = 16
_SUBJECTS_PER_CHECK = 64
# Workspaces checked in one go at most.
_BATCH = 10_000
# Empty workspaces whose tasks are dropped at once (a consumer info, a purge and a read each).
_DROPS_AT_ONCE = 32
# After NATS trouble a workspace joins the line again this much later.
_RETRY_AFTER = 1.0
# After a purge, the look for a request stored meanwhile (and its task published again) is tried again after these
# pauses (about 6 s in all); still failing, its request is left to the orphan sweep (a daemon also sweeps at once
# after every reconnect).
_GIVE_BACK_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)


class Newcomers:
    def __init__(
        self,
        nats: Nats,
        settings: Settings,
        placement: Placement,
        subjects: Subjects,
        *,
        make_consumer: Callable[[WorkspacePk], Awaitable[None]],
        ready: Callable[[WorkspacePk], None],
        again: Callable[[WorkspacePk], None],
    ) -> None:
        """``make_consumer``: make a workspace's consumer (or find it made); ``ready``: it has one now, its turn is
        next; ``again``: it could not be checked (NATS trouble), it joins the line again."""
        self._nats = nats
        self._timeout = settings.nats_timeout
        self._placement = placement
        self._subjects = subjects
        self._make_consumer = make_consumer
        self._ready = ready
        self._again = again
        self._waiting: dict[WorkspacePk, None] = {}  # to be checked, oldest first
        self._wake = asyncio.Event()
        self._busy: set[WorkspacePk] = set()  # being checked, or its tasks dropped
        self._asked_again: set[WorkspacePk] = set()
        self._drops = asyncio.Semaphore(_DROPS_AT_ONCE)
        self._background: set[asyncio.Task[None]] = set()
        self.empty_tasks_dropped = 0  # tasks of workspaces with nothing else, for /status
        self.tasks_given_back = 0  # tasks published again after a purge, for requests stored during the check
        self.batches_read = 0  # reads of which workspaces have requests (many checked together)
        self.rechecks = 0  # checks given again for a task stored after the purge's bound was read

    def __len__(self) -> int:
        return len(self._waiting) + len(self._busy)

    def check(self, workspace: WorkspacePk) -> None:
        """Check ``workspace`` soon. Asked again while it is checked (a task published meanwhile, maybe after the
        sequence its purge goes up to), it is checked once more after, unless it was found with work."""
        if workspace in self._busy:
            self._asked_again.add(workspace)
        elif workspace not in self._waiting:
            self._waiting[workspace] = None
            self._wake.set()

    async def run(self) -> None:
        """Check the workspaces as they come, until cancelled."""
        try:
            while True:
                if not self._waiting:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                batch = []
                for workspace in self._waiting:
                    batch.append(workspace)
                    if len(batch) >= _BATCH:
                        break
                for workspace in batch:
                    del self._waiting[workspace]
                self._busy.update(batch)
                try:
                    await self._sort(batch)
                except Exception as err:  # NATS trouble: each joins the line again in a while
                    log.debug("checking %d workspaces failed: %r", len(batch), err)
                    for workspace in batch:
                        self._failed(workspace)
        finally:
            background = list(self._background)
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    async def _sort(self, batch: list[WorkspacePk]) -> None:
        layout = self._placement.layout
        if layout.migrating or layout.switching_intake:
            # Tasks may be held through another shard's consumer or the shared one: each is served as before.
            for workspace in batch:
                self._spawn(self._admit(workspace))
            return
        if len(batch) <= _ONE_BY_ONE:
            # One read each, and a newcomer with work is admitted at once; an empty-looking one is read again after
            # the tasks stream's last sequence (_drop_if_empty).
            found = await asyncio.gather(*(self._queued(workspace) for workspace in batch))
            for workspace, queued in zip(batch, found, strict=True):
                self._spawn(self._admit(workspace) if queued else self._drop_if_empty(workspace, None))
            return
        # Read before the requests are: a task published after this read is never dropped (see the module).
        last_seq = await self._last_task_seq()
        with_requests = await self._with_requests(batch)
        for workspace in batch:
            if workspace in with_requests:
                self._spawn(self._admit(workspace))
            else:
                self._spawn(self._drop_if_empty(workspace, last_seq))

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _admit(self, workspace: WorkspacePk) -> None:
        try:
            await self._make_consumer(workspace)
        except Exception as err:
            log.debug("making workspace %s's consumer failed: %r", workspace, err)
            self._failed(workspace)
            return
        self._ready(workspace)
        self._finished(workspace, ready=True)

    async def _drop_if_empty(self, workspace: WorkspacePk, last_seq: int | None) -> None:
        """``workspace`` had no request queued after the tasks stream's ``last_seq`` was read (None: read it, and
        the requests again): unless its consumer exists (a daemon may hold its tasks), its tasks up to
        ``last_seq`` go, and any request stored meanwhile gets its task again."""
        subjects = self._subjects
        purging = False
        try:
            async with self._drops:
                if last_seq is None:
                    last_seq = await self._last_task_seq()
                    if await self._queued(workspace):
                        await self._admit(workspace)
                        return
                if await self._consumer_exists(workspace):
                    self._ready(workspace)
                    self._finished(workspace, ready=True)
                    return
                request = {"filter": subjects.tasks_of_workspace(workspace), "seq": last_seq + 1}
                purging = True
                answer = await js_api(
                    self._nats.requester,
                    f"STREAM.PURGE.{subjects.tasks_stream}",
                    request,
                    timeout=self._timeout,
                )
                purged = int(answer.get("purged", 0))
                self.empty_tasks_dropped += purged
                log.debug("workspace %s: %d tasks with no request dropped", workspace, purged)
                if not purged and await self._has_tasks(workspace):
                    # Stored after the read of the last sequence (the daemon hears a publish as the stream does):
                    # the purge stopped short of it, and the next discovery is 10 s away.
                    self.rechecks += 1
                    self._asked_again.add(workspace)
        except Exception as err:
            log.debug("dropping workspace %s's tasks failed: %r", workspace, err)
            if purging:
                # The purge's answer may be lost with the purge done: its tasks are given back all the same.
                await self._give_back(workspace)
            self._failed(workspace)
            return
        await self._give_back(workspace)
        self._finished(workspace, ready=False)

    async def _give_back(self, workspace: WorkspacePk) -> None:
        """After a purge of ``workspace``'s tasks: a request stored during the check may have found its task among
        those purged (its own publish refused as a duplicate), so each change set of the workspace with requests
        gets its task again. Tried again after NATS trouble (a read or a publish that failed), with backoff: a
        request whose task is gone would otherwise wait for the orphan sweep."""
        for pause in (*_GIVE_BACK_PAUSES, None):
            try:
                if await self._queued(workspace):
                    await self._tasks_again(workspace)
                return
            except Exception as err:
                if pause is None:
                    log.warning(
                        "workspace %s: giving its tasks back after a purge failed (%r); the orphan sweep will",
                        workspace,
                        err,
                    )
                    return
                log.debug(
                    "workspace %s: giving its tasks back after a purge failed (%r); again", workspace, err
                )
                await asyncio.sleep(pause)

    def _failed(self, workspace: WorkspacePk) -> None:
        asyncio.get_running_loop().call_later(_RETRY_AFTER, self._again, workspace)
        self._finished(workspace, ready=True)  # (asked again or not: it joins the line again anyway)

    def _finished(self, workspace: WorkspacePk, *, ready: bool) -> None:
        self._busy.discard(workspace)
        again = workspace in self._asked_again
        self._asked_again.discard(workspace)
        if again and not ready:
            self.check(workspace)

    # -- reads ----------------------------------------------------------------------------------------
    async def _last_task_seq(self) -> int:
        return int((await self._info(self._subjects.tasks_stream))["state"]["last_seq"])

    async def _with_requests(self, batch: list[WorkspacePk]) -> set[WorkspacePk]:
        """The workspaces of ``batch`` with a request queued, as the stream leader has it: one read of the requests
        stream's subjects if it lists few enough per workspace of the batch, else one read each."""
        requests = self._subjects.requests_stream
        subjects = int((await self._info(requests))["state"].get("num_subjects", 0))
        if subjects <= len(batch) * _SUBJECTS_PER_CHECK:
            return set(batch).intersection(await self._workspaces_with_requests())
        found = await asyncio.gather(*(self._queued(workspace) for workspace in batch))
        return {workspace for workspace, queued in zip(batch, found, strict=True) if queued}

    async def _workspaces_with_requests(self) -> Iterable[WorkspacePk]:
        """Every workspace with a request in this shard's requests stream (its subjects, page by page)."""
        subjects = self._subjects
        found: set[WorkspacePk] = set()
        offset = 0
        self.batches_read += 1
        while True:
            request = {"subjects_filter": subjects.requests_all, "offset": offset}
            answer = await self._info(subjects.requests_stream, request)
            page = answer["state"].get("subjects") or {}
            for subject in page:
                with contextlib.suppress(InvalidSubject):
                    found.add(subjects.parse_requests(subject).workspace_id)
            offset += len(page)
            if not page or offset >= int(answer.get("total", 0)):
                return found

    async def _queued(self, workspace: WorkspacePk) -> bool:
        subjects = self._subjects
        last = await self._nats.reads.last_message(
            subjects.requests_stream, subjects.requests_of_workspace(workspace), timeout=self._timeout
        )
        return last is not None

    async def _has_tasks(self, workspace: WorkspacePk) -> bool:
        subjects = self._subjects
        last = await self._nats.reads.last_message(
            subjects.tasks_stream, subjects.tasks_of_workspace(workspace), timeout=self._timeout
        )
        return last is not None

    async def _consumer_exists(self, workspace: WorkspacePk) -> bool:
        name = self._subjects.workspace_tasks_consumer(workspace)
        try:
            await self._nats.js.consumer_info(self._subjects.tasks_stream, name)
        except NotFoundError:
            return False
        return True

    async def _info(self, stream: str, request: dict[str, Any] | None = None) -> dict[str, Any]:
        return await js_api(self._nats.requester, f"STREAM.INFO.{stream}", request, timeout=self._timeout)

    async def _tasks_again(self, workspace: WorkspacePk) -> None:
        """A request of ``workspace`` came during the purge: each of its change sets with requests gets a task (one
        that has it already refuses the publish, which is success). A publish that failed is raised, after the
        others were tried: the caller tries them all again."""
        subjects = self._subjects
        request = {"subjects_filter": subjects.requests_of_workspace(workspace)}
        info = await self._info(subjects.requests_stream, request)
        failed: Exception | None = None
        for subject in info["state"].get("subjects") or {}:
            try:
                parsed = subjects.parse_requests(subject)
            except InvalidSubject:
                continue  # (junk: the orphan sweep removes it)
            try:
                published = await publish_task(
                    self._nats.nc,
                    subjects.task(parsed.workspace_id, parsed.change_set_id),
                    timeout=self._timeout,
                    requester=self._nats.requester,
                )
            except Exception as err:
                failed = err
                continue
            if published:
                self.tasks_given_back += 1
        if failed is not None:
            raise failed
