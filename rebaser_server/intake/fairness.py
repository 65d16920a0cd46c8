"""Fair share across workspaces: one workspace's flood must not take every slot of a daemon while another waits.

A daemon owns at most ``share`` change sets of one workspace (``max_owned_per_workspace``; by default half of
``concurrency``) *while another workspace has tasks in the stream*. Alone, a workspace may take every slot: the share
costs nothing when there is nobody to share with. A task over the share goes back to the stream with a delay that
grows with its deliveries (owned.py), so the flood's tasks come back ever more slowly while others are served.

Which workspaces have tasks is read from the tasks streams' subjects (one stream info per served shard, at most
once every :data:`REFRESH` seconds, and only while some workspace is at its share). A task counts whether it waits or
is owned by some daemon: a workspace with work in progress is one to share with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable

from rebaser_core.errors import InvalidSubject
from rebaser_core.ids import WorkspacePk
from rebaser_core.nats.listing import stream_subjects
from rebaser_core.settings import Settings
from rebaser_server.changeset.context import Nats, Placement

__all__ = ["FairShare"]

log = logging.getLogger(__name__)

# The workspaces with tasks are read again at most this often (while some workspace is at its share).
REFRESH = 1.0
# What a task taken counts for the share served halves this often: the share is of the last minute or two.
SERVED_HALF_LIFE = 60.0


class FairShare:
    def __init__(self, nats: Nats, settings: Settings, placement: Placement) -> None:
        self._nats = nats
        self._settings = settings
        self._placement = placement
        self.share = settings.max_owned_per_workspace or max(1, settings.concurrency // 2)
        self.by_workspace: Counter[WorkspacePk] = Counter()  # change sets owned here now
        self.tasks: Counter[WorkspacePk] = (
            Counter()
        )  # tasks in the streams per workspace (waiting or owned), as last read
        # Tasks taken per workspace lately (halved every SERVED_HALF_LIFE seconds): the share each is served.
        self.served: Counter[WorkspacePk] = Counter()
        self._halved_at = time.monotonic()
        self._read_at = float("-inf")
        self._reading: asyncio.Task[None] | None = None
        self._clock: Callable[[], float] = time.monotonic

    def must_wait(self, workspace: WorkspacePk) -> bool:
        """Whether a task of ``workspace`` goes back to the stream: its share is taken here and another workspace has
        tasks (as last read; a read is started if that is old)."""
        if self.by_workspace[workspace] < self.share:
            return False
        self._refresh()
        return any(other != workspace for other in self.tasks)

    def taken(self, workspace: WorkspacePk) -> None:
        self.by_workspace[workspace] += 1
        self.served[workspace] += 1
        self._age()

    def served_lately(self) -> Counter[WorkspacePk]:
        """Tasks taken per workspace lately (each counts half as much every :data:`SERVED_HALF_LIFE` seconds)."""
        self._age()
        return self.served

    def _age(self) -> None:
        now = self._clock()
        while now - self._halved_at >= SERVED_HALF_LIFE:
            self._halved_at += SERVED_HALF_LIFE
            self.served = Counter({wk: n // 2 for wk, n in self.served.items() if n >= 2})
            if not self.served:
                self._halved_at = now

    def ended(self, workspace: WorkspacePk) -> None:
        self.by_workspace[workspace] -= 1
        if self.by_workspace[workspace] <= 0:
            del self.by_workspace[workspace]

    def _refresh(self) -> None:
        if self._clock() - self._read_at < REFRESH or (
            self._reading is not None and not self._reading.done()
        ):
            return
        self._read_at = self._clock()
        self._reading = asyncio.create_task(self._read(), name="fair share: workspaces with tasks")

    def tasks_by_workspace(self) -> Counter[WorkspacePk]:
        """Tasks in the streams per workspace as last read; a read starts in the background if that is over
        :data:`REFRESH` seconds old (a status page must not wait on NATS: it is read during outages too)."""
        self._refresh()
        return self.tasks

    async def _read(self) -> None:
        found: Counter[WorkspacePk] = Counter()
        try:
            for shard in self._placement.layout.shards:
                subjects = self._settings.subjects.for_shard(shard)
                tasks = await stream_subjects(self._nats.js, subjects.tasks_stream, subjects.tasks_all)
                for subject, count in tasks.items():
                    with contextlib.suppress(InvalidSubject):
                        found[subjects.parse_task(subject).workspace_id] += count
        except Exception as err:  # NATS trouble: keep the last view, read again later
            log.debug("reading the workspaces with tasks failed: %r", err)
            return
        self.tasks = found

    async def stop(self) -> None:
        reading, self._reading = self._reading, None
        if reading is not None and not reading.done():
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
