"""The ``backlog`` query: how many requests a workspace has queued, over every shard, and its limit.

Counted from the requests streams' per-subject state (one stream info per shard, filtered on the workspace's
subjects: its cost grows with the workspace's change sets with requests queued, not with other workspaces'), and
kept for :data:`BACKLOG_TTL` seconds: many clients of one workspace then cost the NATS servers one count a second,
not one each. Every workspace's queued requests together (one stream info per shard, unfiltered) are kept as long:
while they are under half the limit, a client asks nothing per workspace (rebaser_client._backlog).
"""

from __future__ import annotations

import asyncio
import time

from nats.js import JetStreamContext

from rebaser_core.ids import WorkspacePk
from rebaser_core.settings import Settings
from rebaser_server.changeset.context import Placement

__all__ = ["BACKLOG_TTL", "WorkspaceBacklogs"]

BACKLOG_TTL = 0.5
_MAX_KEPT = (
    10_000  # counts kept; past it the oldest go (a flood of made-up workspaces must not grow it for ever)
)


class WorkspaceBacklogs:
    def __init__(self, js: JetStreamContext, settings: Settings, placement: Placement) -> None:
        self._js = js
        self._settings = settings
        self._placement = placement
        self._counted: dict[WorkspacePk, tuple[float, int]] = {}  # workspace -> (when, queued)
        self._counting: dict[WorkspacePk, asyncio.Future[int]] = {}
        self._total: tuple[float, int] | None = None  # (when, every workspace's queued requests)
        self._totalling: asyncio.Future[int] | None = None

    @property
    def limit(self) -> int:
        """The most requests one workspace may have queued (0: no limit)."""
        return max(self._settings.workspace_max_requests, 0)

    async def queued(self, workspace_id: WorkspacePk) -> int:
        """The workspace's queued requests, as counted at most :data:`BACKLOG_TTL` seconds ago."""
        counted = self._counted.get(workspace_id)
        if counted is not None and time.monotonic() - counted[0] < BACKLOG_TTL:
            return counted[1]
        counting = self._counting.get(workspace_id)
        if counting is None:  # one count at a time per workspace; the queries meanwhile share it
            counting = asyncio.ensure_future(self._count(workspace_id))
            self._counting[workspace_id] = counting
            counting.add_done_callback(lambda _: self._counting.pop(workspace_id, None))
        return await asyncio.shield(counting)

    async def total(self) -> int:
        """Every workspace's queued requests, over every shard, as counted at most :data:`BACKLOG_TTL` seconds ago."""
        if self._total is not None and time.monotonic() - self._total[0] < BACKLOG_TTL:
            return self._total[1]
        if self._totalling is None:  # one count at a time; the queries meanwhile share it
            self._totalling = asyncio.ensure_future(self._count_total())
            self._totalling.add_done_callback(self._totalled)
        return await asyncio.shield(self._totalling)

    def _totalled(self, _: asyncio.Future[int]) -> None:
        self._totalling = None

    async def count_total(self) -> int:
        """Every workspace's queued requests, counted now (kept for :meth:`total` too)."""
        return await self._count_total()

    async def _count_total(self) -> int:
        subjects = self._settings.subjects
        total = 0
        for shard in self._placement.layout.shards:
            info = await self._js.stream_info(subjects.for_shard(shard).requests_stream)
            total += info.state.messages
        self._total = (time.monotonic(), total)
        return total

    async def count(self, workspace_id: WorkspacePk) -> int:
        """The workspace's queued requests, counted now (kept for :meth:`queued` too)."""
        return await self._count(workspace_id)

    async def _count(self, workspace_id: WorkspacePk) -> int:
        subjects = self._settings.subjects
        total = 0
        for shard in self._placement.layout.shards:
            names = subjects.for_shard(shard)
            info = await self._js.stream_info(
                names.requests_stream, subjects_filter=names.requests_of_workspace(workspace_id)
            )
            total += sum((info.state.subjects or {}).values())
        if len(self._counted) >= _MAX_KEPT:
            del self._counted[next(iter(self._counted))]
        self._counted.pop(workspace_id, None)
        self._counted[workspace_id] = (time.monotonic(), total)
        return total
