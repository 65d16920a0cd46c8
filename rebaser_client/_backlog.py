"""The client's side of a workspace's request limit (``workspace_max_requests``): before a request is published, the
workspace's queued requests as a daemon last counted them (the ``backlog`` query, asked in the background), plus what
this client sent since; at the limit, ``RebaserBusy`` naming the workspace.

A count is asked for only where the limit may be near, so what the check costs follows what a client sends, not how
many workspaces it sends to:

- every answer also says how many requests every workspace together has queued (``total_queued``, version 2). While
  that, with what this client sent since, is under half the limit, no workspace can be near it: nothing is asked per
  workspace, and the total is asked for again once it is :data:`RECOUNT_AFTER` old (if this client sent since);
- otherwise (a total near half the limit, or a daemon that answers version 1 only), a workspace's first count once
  this client has sent it :data:`FIRST_ASK_AFTER` requests, then a new count once the last one is :data:`REFRESH`
  old if it (with what this client sent since) reaches half of the limit, else once it is :data:`RECOUNT_AFTER` old
  and this client sent more since.

The check never delays a request: until a count arrives (no daemon answering) the request goes. So a workspace can
pass its limit by what its clients send before a count (at most ``FIRST_ASK_AFTER`` each) and within about a second;
the limit keeps one workspace from filling the streams every workspace shares, it is not an exact quota
(docs/capacity.md#bounds). A caller in an account of its own is held to it by the daemons' request gate too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from rebaser_client._queries import Queries, refusal
from rebaser_core.api import (
    WORKSPACE_BACKLOG_REQUEST,
    WORKSPACE_BACKLOG_RESPONSE,
    WorkspaceBacklogRequest,
    WorkspaceBacklogResponse,
)
from rebaser_core.errors import ClientError, ProtocolError, RebaserBusy
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk

__all__ = ["BacklogCheck", "ask_backlog"]

log = logging.getLogger(__name__)

REFRESH = 1.0
"""Seconds a count near the limit is used before it is asked for again."""
RECOUNT_AFTER = 30.0
"""Seconds any other count is used before it is asked for again (if this client sent more since)."""
FIRST_ASK_AFTER = 16
"""Requests this client sends to a workspace before it asks for the workspace's first count."""
_RETRY_AFTER = 1.0
_QUERY_TIMEOUT = 2.0
_MAX_KEPT = 10_000  # workspaces whose counts a client keeps; past it the one used longest ago goes


async def ask_backlog(
    queries: Queries, workspace_id: WorkspacePk, change_set_id: ChangeSetId, timeout: float
) -> WorkspaceBacklogResponse:
    """One ``backlog`` query; ``RebaserRefused`` if the daemon could not count."""
    request = WorkspaceBacklogRequest(
        id=RequestId.new(), workspace_id=workspace_id, change_set_id=change_set_id
    )
    response = await queries.ask(
        "backlog", request, WORKSPACE_BACKLOG_REQUEST, WORKSPACE_BACKLOG_RESPONSE, timeout
    )
    assert isinstance(response, WorkspaceBacklogResponse)
    if response.error is not None:
        raise refusal(response.error)
    return response


@dataclass(frozen=True, slots=True)
class _Count:
    queued: int
    limit: int
    at: float
    sent_before: int  # what this client had sent to the workspace when it asked for this count


class BacklogCheck:
    def __init__(self, queries: Queries) -> None:
        self._queries = queries
        self._counts: dict[WorkspacePk, _Count] = {}
        self._sent: dict[WorkspacePk, int] = {}  # requests sent to each workspace counted
        self._asking: dict[WorkspacePk, asyncio.Task[bool]] = {}
        # Every workspace's queued requests (``sent_before``: what this client had sent to any workspace).
        self._total: _Count | None = None
        self._sent_all = 0  # requests this client sent, to any workspace

    async def check(self, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> None:
        """Raise ``RebaserBusy(limit="workspace_requests")`` if the workspace is at its limit; ask for a fresh count
        (in the background) where the limit may be near (see the module doc).

        A workspace the daemons counted at its limit a moment ago is refused at once (a flood costs no query).
        One that only this client's requests sent since would bring there is counted again first: those may be
        processed already, and a workspace that is served as fast as it sends is never refused."""
        sent = self._touch(workspace_id)
        count = self._counts.get(workspace_id)
        if self._far_below(count, workspace_id, change_set_id):
            return
        if count is None:
            if sent >= FIRST_ASK_AFTER:
                self._asking_now(workspace_id, change_set_id)
            return
        age = time.monotonic() - count.at
        if count.limit <= 0:
            if age >= RECOUNT_AFTER and sent > count.sent_before:
                self._asking_now(workspace_id, change_set_id)  # (a limit may have been set since)
            return
        queued = self._queued(workspace_id, count)
        if (age >= REFRESH and 2 * queued >= count.limit) or (
            age >= RECOUNT_AFTER and sent > count.sent_before
        ):
            self._asking_now(workspace_id, change_set_id)
        if age < REFRESH and count.queued >= count.limit:
            raise self._busy(workspace_id, count.queued, count.limit)
        if queued >= count.limit and await self._asking_now(workspace_id, change_set_id):
            count = self._counts[workspace_id]
            if count.limit > 0 and self._queued(workspace_id, count) >= count.limit:
                raise self._busy(workspace_id, self._queued(workspace_id, count), count.limit)

    def sent(self, workspace_id: WorkspacePk) -> None:
        self._sent_all += 1
        if workspace_id in self._sent:
            self._sent[workspace_id] += 1

    def _far_below(self, count: _Count | None, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> bool:
        """Whether every workspace together, as last counted (not before this workspace's own count) with what this
        client sent since, is under half the limit, or there is no limit: then no workspace is near it. A total
        :data:`RECOUNT_AFTER` old is asked for again (in the background, with this workspace's count)."""
        total = self._total
        if total is None or (count is not None and count.at > total.at):
            return False
        stale = time.monotonic() - total.at >= RECOUNT_AFTER and self._sent_all > total.sent_before
        if stale and not self._asking:  # one count at a time refreshes the total
            self._asking_now(workspace_id, change_set_id)
        if total.limit <= 0:
            return True
        return 2 * (total.queued + self._sent_all - total.sent_before) < total.limit

    def _touch(self, workspace_id: WorkspacePk) -> int:
        """What this client sent to ``workspace_id`` so far, which becomes the last workspace to be forgotten (dicts
        keep insertion order); past :data:`_MAX_KEPT` workspaces the one used longest ago goes."""
        sent = self._sent.pop(workspace_id, None)
        if sent is None:
            sent = 0
            if len(self._sent) >= _MAX_KEPT:  # a client of very many workspaces
                forgotten = next((w for w in self._sent if w not in self._asking), None)
                if forgotten is not None:
                    del self._sent[forgotten]
                    self._counts.pop(forgotten, None)
        self._sent[workspace_id] = sent
        return sent

    def _queued(self, workspace_id: WorkspacePk, count: _Count) -> int:
        """The count, and what this client sent since it asked for it (a daemon may have counted some already)."""
        return count.queued + self._sent[workspace_id] - count.sent_before

    async def close(self) -> None:
        tasks = list(self._asking.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    def _busy(workspace_id: WorkspacePk, queued: int, limit: int) -> RebaserBusy:
        return RebaserBusy(
            f"workspace {workspace_id} has {queued} requests queued, its limit is {limit} (workspace_max_requests)",
            retry_after=_RETRY_AFTER,
            limit="workspace_requests",
            workspace=str(workspace_id),
        )

    def _asking_now(self, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> asyncio.Task[bool]:
        """The count being asked for (one at a time per workspace), started if none is."""
        task = self._asking.get(workspace_id)
        if task is None:
            task = asyncio.ensure_future(self._ask(workspace_id, change_set_id))
            self._asking[workspace_id] = task
            task.add_done_callback(lambda _: self._asking.pop(workspace_id, None))
        return task

    async def _ask(self, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> bool:
        """Ask for a count; False if none came (no daemon answers, an older one, it could not count): the requests
        go unchecked meanwhile."""
        if workspace_id not in self._sent:  # forgotten before it was asked
            return False
        sent_before, sent_all_before = self._sent[workspace_id], self._sent_all
        try:
            response = await ask_backlog(self._queries, workspace_id, change_set_id, _QUERY_TIMEOUT)
        except (ClientError, ProtocolError) as err:
            log.debug("no backlog count for workspace %s: %s", workspace_id, err)
            return False
        now = time.monotonic()
        if response.total_queued is not None:  # (None: a daemon that answers version 1 only)
            self._total = _Count(response.total_queued, response.limit, now, sent_all_before)
        if workspace_id not in self._sent:  # forgotten meanwhile
            return False
        self._counts[workspace_id] = _Count(response.queued, response.limit, now, sent_before)
        return True
