"""The request gate: a workspace's queued-request limit kept where a caller cannot skip it.

nats-server counts a stream's messages per stream and per subject, never per workspace, so a caller that publishes
into the requests stream itself can pass ``workspace_max_requests`` (the client checks it, but a caller need not use
the client) and fill what every workspace shares. A caller in an account of its own (docs/accounts.md) publishes its
requests to ``rebaser.requests.…`` as ever, but its account imports that subject from the daemons' account as
``rebaser.gate.requests.…``: the request comes to a daemon, not to the stream. The daemon checks the workspace's
count and publishes the request into the stream unchanged (same subject without ``gate.``, headers, body), and
answers JetStream's acknowledgement back; over the limit it answers JetStream's "full" refusal naming the workspace
(err_code 10077), which the client reads as ``RebaserBusy(limit="workspace_requests")``.

Passing a request on costs the daemon two messages in and two out. While every workspace together has under half the
limit queued (counted at most :data:`TOTAL_TTL` ago, one stream info per shard, plus what this daemon admitted since),
no workspace can be near it, and nothing is counted per workspace. Otherwise the workspace's count is the ``backlog``
query's (``WorkspaceBacklogs``), asked again only when the workspace may be near its limit (the last count plus what
this daemon admitted since reaches half of it) or the count is older than :data:`RECOUNT_AFTER`. It is a bound
against floods, not an exact quota: each daemon admits on its own view.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from rebaser_core.errors import InvalidReplyInbox, InvalidSubject
from rebaser_core.ids import WorkspacePk
from rebaser_core.inbox import check_query_reply
from rebaser_core.nats.inline_subscription import subscribe_inline
from rebaser_core.settings import Settings
from rebaser_server.queries.backlog import WorkspaceBacklogs

__all__ = ["GATE_QUEUE", "RECOUNT_AFTER", "RequestGate"]

log = logging.getLogger(__name__)

GATE_QUEUE = "rebaser-gate"
RECOUNT_AFTER = 30.0
TOTAL_TTL = 0.5  # every workspace's count is asked again after this long (one stream info per shard)
_MAX_IN_FLIGHT = 1024  # requests one daemon passes on at once; past it, "busy" (the caller's client retries)
_MAX_REFUSALS = (
    1024  # refusals on their way at once; past it a request is dropped (the caller's client resends)
)
_MAX_KEPT = 10_000  # workspaces whose admissions are counted; past it the longest-known goes
# Headers nats-server adds on the way through an import: not the caller's, not stored.
_SERVER_HEADERS = ("Nats-Request-Info",)


@dataclass(frozen=True, slots=True)
class _Total:
    at: float
    queued: int  # every workspace's, as counted
    admitted_before: int  # what this daemon had admitted (to any workspace) when the count started


@dataclass(frozen=True, slots=True)
class _Count:
    workspace_id: WorkspacePk
    at: float
    queued: int  # as counted
    admitted_before: int  # what this daemon had admitted for the workspace when the count started


class RequestGate:
    def __init__(self, nc: NatsClient, settings: Settings, backlogs: WorkspaceBacklogs) -> None:
        self._nc = nc
        self._settings = settings
        self._subjects = settings.subjects
        self._backlogs = backlogs
        self._counts: dict[WorkspacePk, _Count] = {}
        self._admitted: dict[WorkspacePk, int] = {}  # what this daemon admitted (reserved) for each workspace
        self._counting: dict[WorkspacePk, asyncio.Future[_Count]] = {}
        self._tasks: set[asyncio.Future[None]] = set()  # requests being passed on (or refused after a count)
        self._refusing: set[asyncio.Future[None]] = set()  # refusals on their way
        self._sub: Subscription | None = None
        self.admitted = 0
        self.refused = 0
        self.dropped = 0  # requests left unanswered, past both bounds (the caller's client sends again)
        self._admitted_all = 0  # what this daemon admitted, to any workspace
        self._total: _Total | None = None  # every workspace's queued requests
        self._totalling: asyncio.Future[_Total] | None = None

    @property
    def subject(self) -> str:
        return self._subjects.gate_all

    async def start(self) -> None:
        self._sub = await subscribe_inline(self._nc, self.subject, self._admit, queue=GATE_QUEUE)

    async def stop(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()
        running = self._tasks | self._refusing
        if running:
            await asyncio.wait(running, timeout=self._settings.nats_timeout)

    def _admit(self, msg: Msg) -> None:
        """Called in nats-py's read loop for each request: passed on by a task of its own (the other requests do not
        wait for its round trip; its workspace is counted first when the last count may be near the limit or old),
        at most :data:`_MAX_IN_FLIGHT` at once; past that refused at once. Nothing waits in a queue."""
        if not msg.reply:
            return  # a JetStream publish always wants its acknowledgement; nothing to answer
        try:
            # The answer goes to this subject: one nats-server made (the caller is in another account) or an inbox,
            # never a subject a stream stores (a user of this account may name one).
            check_query_reply(msg.reply, self._settings.reply_inbox_prefix, self._subjects)
            subject = self._subjects.ungated(msg.subject)
            workspace_id = self._subjects.parse_any_requests(subject).workspace_id
        except (InvalidSubject, InvalidReplyInbox) as err:
            log.warning("gate: refusing %s: %s", msg.subject[:200], err)
            self._refuse(msg, _refusal(400, 10003, f"not a request the gate passes on: {err}"))
            return
        if len(self._tasks) >= _MAX_IN_FLIGHT:
            self._refuse(msg, _refusal(503, 10023, "the request gate is busy; retry"))
            return
        task = asyncio.ensure_future(self._counted(msg, subject, workspace_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refuse(self, msg: Msg, body: bytes) -> None:
        """Answer ``body`` in a task of its own, at most :data:`_MAX_REFUSALS` at once; past that the request is
        dropped (its caller's client sends it again after its publish timeout)."""
        if len(self._refusing) >= _MAX_REFUSALS:
            self.dropped += 1
            return
        task = asyncio.ensure_future(self._answer(msg, body))
        self._refusing.add(task)
        task.add_done_callback(self._refusing.discard)

    async def _far_below(self) -> bool:
        """Whether every workspace together, counted at most :data:`TOTAL_TTL` ago, with what this daemon admitted
        since, is under half the limit: then no workspace can be near it, and nothing is counted or kept per
        workspace. (What other daemons admitted since is not in it: each daemon admits on its own view.)"""
        limit = self._backlogs.limit
        if limit <= 0:
            return False  # (no limit: _admit_now admits without a count)
        total = self._total
        if total is None or time.monotonic() - total.at >= TOTAL_TTL:
            if self._totalling is None:  # one count at a time; the requests meanwhile share it
                self._totalling = asyncio.ensure_future(self._count_total())
                self._totalling.add_done_callback(self._totalled)
            try:
                total = await asyncio.shield(self._totalling)
            except (nats.errors.Error, TimeoutError):
                return False  # counted per workspace instead
        return 2 * (total.queued + self._admitted_all - total.admitted_before) < limit

    async def _count_total(self) -> _Total:
        before = self._admitted_all
        queued = await self._backlogs.count_total()
        self._total = _Total(time.monotonic(), queued, before)
        return self._total

    def _totalled(self, _: asyncio.Future[_Total]) -> None:
        self._totalling = None

    def _admit_now(self, workspace_id: WorkspacePk) -> bool:
        """Whether the workspace's last count, with what this daemon admitted since, is fresh and under half the
        limit (then the request is reserved and passed on without a count)."""
        limit = self._backlogs.limit
        if limit <= 0:
            return True  # no limit: nothing to count, nothing kept per workspace
        if self._to_count(self._counts.get(workspace_id), limit):
            return False
        self._admitted[workspace_id] = self._admitted.get(workspace_id, 0) + 1
        self._admitted_all += 1
        return True

    def _to_count(self, count: _Count | None, limit: int) -> bool:
        """Whether the workspace is to be counted again: no count, an old one, or one near the limit."""
        return (
            count is None
            or time.monotonic() - count.at > RECOUNT_AFTER
            or self._estimate(count) >= limit // 2
        )

    async def _counted(self, msg: Msg, subject: str, workspace_id: WorkspacePk) -> None:
        try:
            if await self._far_below():
                self._admitted_all += 1
                over = None
            else:
                over = None if self._admit_now(workspace_id) else await self._reserve(workspace_id)
            if over is not None:
                self.refused += 1
                await self._answer(msg, _refusal(400, 10077, over))
                return
            await self._pass_on(msg, subject, workspace_id)
        except Exception:
            log.exception("gate: request on %s failed", msg.subject[:200])

    async def _pass_on(self, msg: Msg, subject: str, workspace_id: WorkspacePk) -> None:
        """Publish the request into its stream, unchanged, and answer JetStream's answer back. (Published with the
        caller's reply subject instead, JetStream's answer never reached the caller with nats-server 2.15: the
        route back through the import did not carry it.)"""
        headers = {k: v for k, v in (msg.headers or {}).items() if k not in _SERVER_HEADERS}
        try:
            ack = await self._nc.request(
                subject, msg.data, headers=headers or None, timeout=self._settings.nats_timeout
            )
        except (nats.errors.Error, TimeoutError) as err:
            # No answer: the caller's client sends the request again (same Nats-Msg-Id: stored once).
            log.warning("gate: %s not passed on: %r", subject[:200], err)
            return
        self.admitted += 1
        if b'"error"' in ack.data and workspace_id in self._admitted:  # refused by the stream: not queued
            self._admitted[workspace_id] -= 1
        await self._answer(msg, ack.data)

    async def _reserve(self, workspace_id: WorkspacePk) -> str | None:
        """Count one more request of the workspace as queued, or say why it may not be."""
        limit = self._backlogs.limit
        if limit <= 0:
            return None
        count = self._counts.get(workspace_id)
        if count is None or self._to_count(count, limit):
            try:
                count = await self._recount(workspace_id)
            except (nats.errors.Error, TimeoutError) as err:
                log.warning("gate: no count for workspace %s (%r): admitting", workspace_id, err)
                return None
        queued = self._estimate(count)
        if queued >= limit:
            return (
                f"maximum messages per workspace exceeded: workspace {workspace_id} has {queued} requests queued, "
                f"its limit is {limit} (workspace_max_requests)"
            )
        # Reserved before the publish, so that the requests passed on meanwhile see it.
        self._admitted[workspace_id] = self._admitted.get(workspace_id, 0) + 1
        self._admitted_all += 1
        return None

    def _estimate(self, count: _Count) -> int:
        """The workspace's queued requests at most: as counted, plus what this daemon admitted since the count
        started (some of those may be in the count already, or applied since)."""
        return count.queued + self._admitted.get(count.workspace_id, 0) - count.admitted_before

    async def _recount(self, workspace_id: WorkspacePk) -> _Count:
        """A count started now (one at a time per workspace; requests meanwhile share it)."""
        counting = self._counting.get(workspace_id)
        if counting is None:
            counting = asyncio.ensure_future(self._count(workspace_id))
            self._counting[workspace_id] = counting
            counting.add_done_callback(lambda _: self._counting.pop(workspace_id, None))
        return await asyncio.shield(counting)

    async def _count(self, workspace_id: WorkspacePk) -> _Count:
        before = self._admitted.get(workspace_id, 0)
        queued = await self._backlogs.count(workspace_id)
        if workspace_id not in self._counts and len(self._counts) >= _MAX_KEPT:
            forgotten = next(iter(self._counts))
            del self._counts[forgotten]
            self._admitted.pop(forgotten, None)
        count = self._counts[workspace_id] = _Count(workspace_id, time.monotonic(), queued, before)
        return count

    async def _answer(self, msg: Msg, body: bytes) -> None:
        try:
            await self._nc.publish(msg.reply, body)
        except nats.errors.Error as err:
            log.warning("gate: could not answer: %r", err)


def _refusal(code: int, err_code: int, description: str) -> bytes:
    """JetStream's form of a refused publish, which every JetStream client reads."""
    return json.dumps(
        {"error": {"code": code, "err_code": err_code, "description": description[:400]}}
    ).encode()
