"""Request/reply queries about change sets (``get``, ``fork``, ``reply``, ``settled``) and workspaces (``backlog``),
answered by any daemon of a queue group.

They read committed records and never take a change set's task: a ``get`` shows the state as of the last commit,
and a ``fork`` creates a record that does not exist yet (refused if it does), so neither races the owner.

Queries are answered side by side, by at most :data:`MAX_QUERIES_IN_FLIGHT` tasks at once; up to
:data:`MAX_QUERIES_WAITING` more wait for one of them (a burst of cheap queries is answered, not refused). Past both a
query is answered at once with a ``busy`` error (while fewer than :data:`MAX_REFUSALS_IN_FLIGHT` such answers are on
their way; past that too it is dropped, and its caller's timeout answers it). So queries that come faster than they
are answered (``backlog`` queries of thousands of workspaces under load) hold a bounded number of messages, never a
queue that grows with the daemon's memory (docs/capacity.md#bounds).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
from collections.abc import Mapping
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from rebaser_core import headers as h
from rebaser_core.api import (
    FORK_CHANGE_SET_REQUEST,
    FORK_CHANGE_SET_RESPONSE,
    GET_CHANGE_SET_REQUEST,
    GET_CHANGE_SET_RESPONSE,
    GET_REPLY_REQUEST,
    GET_REPLY_RESPONSE,
    WAIT_SETTLED_REQUEST,
    WAIT_SETTLED_RESPONSE,
    WORKSPACE_BACKLOG_REQUEST,
    WORKSPACE_BACKLOG_RESPONSE,
    ContentType,
    ForkChangeSetResponse,
    GetChangeSetResponse,
    GetReplyResponse,
    VersionedMessage,
    WaitSettledResponse,
    WorkspaceBacklogResponse,
    backlog_answer_form,
    oldest_reply_form,
)
from rebaser_core.errors import InvalidReplyInbox, InvalidSubject, ProtocolError, Unsupported
from rebaser_core.inbox import check_query_reply, request_id_of
from rebaser_core.nats.inline_subscription import subscribe_inline
from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet, RebaserApp, SupportsDescribe, SupportsFork
from rebaser_server.changeset.context import Placement
from rebaser_server.queries.backlog import WorkspaceBacklogs
from rebaser_server.queries.follow import FollowerConsumers
from rebaser_server.queries.gate import RequestGate
from rebaser_server.queries.settled import SettledWaits
from rebaser_server.record.store import ChangeSetStore

__all__ = ["QueryService"]

log = logging.getLogger(__name__)

QUEUE_GROUP = "rebaser-queries"

MAX_QUERIES_IN_FLIGHT = 256
"""Queries one daemon answers at once (a ``settled`` query is held by SettledWaits once read)."""
MAX_QUERIES_WAITING = 4096
"""Queries that wait for one of those, at most: a few MB of messages."""
MAX_REFUSALS_IN_FLIGHT = 1024
"""Past both, ``busy`` answers on their way at once; past that too a query is dropped."""


class QueryService:
    def __init__(
        self,
        nc: NatsClient,
        js: JetStreamContext,
        settings: Settings,
        *,
        app: RebaserApp,
        store: ChangeSetStore,
        placement: Placement,
    ) -> None:
        self._nc = nc
        self._settings = settings
        self._subjects = settings.subjects
        self._app = app
        self._store = store
        self._sub: Subscription | None = None
        self._answering: set[asyncio.Future[None]] = set()
        self._waiting: collections.deque[Msg] = collections.deque()
        self._refusing: set[asyncio.Future[None]] = set()
        self.refused = 0
        """Queries answered with the busy error since the daemon started."""
        self.dropped = 0
        """Queries dropped unanswered (past both bounds) since the daemon started."""
        self.settled = SettledWaits(
            nc, js, settings, placement
        )  # held ``settled`` queries (rebaser_server/queries/settled.py)
        self.backlogs = WorkspaceBacklogs(js, settings, placement)
        self.followers = FollowerConsumers(nc, settings)  # event followers' consumers, made on their behalf
        self.gate = RequestGate(nc, settings, self.backlogs)  # requests of callers in accounts of their own

    async def start(self) -> None:
        self._sub = await subscribe_inline(self._nc, self._subjects.api_all, self._admit, queue=QUEUE_GROUP)
        await self.gate.start()
        # The server has the interest once it answers a ping: until then a query that comes from another connection
        # gets "no responders", though /readyz already says ready (found by a CLI test on a loaded machine).
        try:
            await self._nc.flush(timeout=math.ceil(self._settings.nats_timeout))
        except (
            nats.errors.Error,
            TimeoutError,
        ) as err:  # not connected: the reconnect sends the interest again
            log.warning("queries: the subscription is not confirmed yet (%s)", err or type(err).__name__)

    async def stop(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()
        self._waiting.clear()
        # The daemon gives this stop twice the NATS timeout: the queries under way and the gate's requests get one
        # (side by side), and the held settled waits the other to answer "ask again" (lost, their callers would wait
        # out their own timeouts).
        await asyncio.gather(self._finish_running(), self.gate.stop())
        await self.settled.stop()

    async def _finish_running(self) -> None:
        """Queries under way get their answers (each a read or two) within the NATS timeout; the rest is cancelled."""
        running = self._answering | self._refusing
        if running:
            _, late = await asyncio.wait(running, timeout=self._settings.nats_timeout)
            for task in late:
                task.cancel()
            # Not waited out: a cancel lost in a NATS read must not hold the daemon's stop.
            if late:
                await asyncio.wait(late, timeout=0.5)

    @property
    def answering(self) -> int:
        """Tasks answering queries now."""
        return len(self._answering)

    @property
    def waiting(self) -> int:
        """Queries waiting for one of those."""
        return len(self._waiting)

    def _admit(self, msg: Msg) -> None:
        """Called in nats-py's read loop for each query: answered by a task, or waiting for one, within the bounds."""
        if len(self._answering) < MAX_QUERIES_IN_FLIGHT:
            self._track(self._answering, self._on_queries(msg))
        elif len(self._waiting) < MAX_QUERIES_WAITING:
            self._waiting.append(msg)
        elif len(self._refusing) < MAX_REFUSALS_IN_FLIGHT and msg.reply:
            self.refused += 1
            self._track(self._refusing, self._answer(msg, busy=True))
        else:
            self.dropped += 1

    @staticmethod
    def _track(running: set[asyncio.Future[None]], work: Any) -> None:
        task = asyncio.ensure_future(work)
        running.add(task)
        task.add_done_callback(running.discard)

    async def _on_queries(self, msg: Msg) -> None:
        """Answer ``msg``, then the queries waiting, one after another, until none is left."""
        while True:
            # An answer that could not be sent (the connection closed) must not strand the queries waiting.
            try:
                await self._answer(msg, busy=False)
            except Exception:
                log.exception("answering the query on %s failed", msg.subject[:200])
            if not self._waiting:
                return
            msg = self._waiting.popleft()

    async def _answer(self, msg: Msg, *, busy: bool) -> None:
        if not msg.reply:
            return
        try:
            check_query_reply(msg.reply, self._settings.reply_inbox_prefix, self._subjects)
        except InvalidReplyInbox as err:
            log.warning("not answering query on %s: %s", msg.subject[:200], err)
            return
        if self._subjects.is_follow_api(msg.subject):
            if not busy:  # (a follower asks again when its request times out)
                await self.followers.answer(msg)
            return
        operation = msg.subject.split(".")[-3]
        query = _QUERIES.get(operation)
        if query is None:
            log.warning("unknown query %s", msg.subject)
            return
        _, response_codec, response_cls = query
        try:
            change_set = self._parse(msg.subject, operation)
            ids: dict[str, Any] = {
                "workspace_id": change_set.workspace_id,
                "change_set_id": change_set.change_set_id,
            }
            if busy:
                error = (
                    f"busy: this daemon answers {MAX_QUERIES_IN_FLIGHT} queries at once already; ask again"
                )
                response = response_cls(id=request_id_of(msg.headers), **ids, error=error)
            else:
                response = await self._response(msg, operation, change_set, ids)
                if response is None:
                    return
        except InvalidSubject as err:
            log.warning("refusing query on %s: %s", msg.subject, err)
            return  # no ids to answer with; the caller times out with its own deadline
        except Exception:
            log.exception("query on %s failed", msg.subject)
            return
        content_type = _content_type(msg.headers)
        if isinstance(response, GetReplyResponse):
            response = oldest_reply_form(response)  # readable by a client that only knows version 1
        elif isinstance(response, WorkspaceBacklogResponse):
            response = backlog_answer_form(response, _asked_version(msg.headers))
        headers, body = response_codec.encode(response, content_type)
        limit = self._nc.max_payload
        if len(body) + h.header_block_size(headers) > limit:
            # NATS would refuse to send it and the caller would only time out: say why instead.
            error = (
                f"the reply ({len(body)} bytes) exceeds the NATS max_payload of {limit} bytes; "
                "ask for one path at a time"
            )
            response = response_cls(id=response.id, **ids, error=error)
            headers, body = response_codec.encode(response, content_type)
        await self._nc.publish(msg.reply, body, headers=headers)

    async def _response(self, msg: Msg, operation: str, change_set: ChangeSet, ids: dict[str, Any]) -> Any:
        """The query's answer (None: a ``settled`` query, answered later from a task of its own)."""
        request_codec, _, response_cls = _QUERIES[operation]
        try:
            request = request_codec.decode(msg.headers, msg.data)
        except ProtocolError as err:
            return response_cls(id=request_id_of(msg.headers), **ids, error=f"{type(err).__name__}: {err}")
        if operation == "settled":
            assert msg.reply
            self.settled.start(msg.reply, change_set, request, _content_type(msg.headers))
            return None
        handler = {
            "get": self._get,
            "fork": self._fork,
            "reply": self._reply,
            "backlog": self._backlog,
        }[operation]
        try:
            return await handler(change_set, request, ids)
        except Exception as err:
            # A corrupt record, a snapshot that cannot be read, NATS trouble: the caller gets the reason now instead
            # of waiting out its timeout for an answer that never comes.
            log.warning("query %s on %s failed: %r", operation, change_set, err)
            return response_cls(id=request.id, **ids, error=f"{type(err).__name__}: {err}"[:1024])

    def _parse(self, subject: str, operation: str) -> ChangeSet:
        parsed = self._subjects.parse_api(subject, operation)
        return ChangeSet(parsed.workspace_id, parsed.change_set_id)

    async def _get(self, change_set: ChangeSet, request: Any, ids: dict[str, Any]) -> GetChangeSetResponse:
        record = await self._store.read(change_set)
        if record is None:
            return GetChangeSetResponse(id=request.id, **ids, exists=False)
        app = self._app
        if not isinstance(app, SupportsDescribe):
            return GetChangeSetResponse(
                id=request.id,
                **ids,
                dvu_pending=record.dvu_pending,
                error=f"this daemon's app ({type(app).__name__}) cannot describe its state (it has no describe())",
            )
        view = await app.describe(change_set, record.state, request.path)
        return GetChangeSetResponse(
            id=request.id,
            **ids,
            snapshot_address=view.snapshot_address,
            dvu_pending=record.dvu_pending,
            values=view.values,
            versions=view.versions,
            errors=view.errors,
            forked_from=view.forked_from,
        )

    async def _reply(self, change_set: ChangeSet, request: Any, ids: dict[str, Any]) -> GetReplyResponse:
        record = await self._store.read(change_set)
        status = None if record is None else record.recorded_status(str(request.request_id))
        return GetReplyResponse(
            id=request.id, **ids, request_id=request.request_id, found=status is not None, status=status
        )

    async def _backlog(
        self, change_set: ChangeSet, request: Any, ids: dict[str, Any]
    ) -> WorkspaceBacklogResponse:
        queued = await self.backlogs.queued(change_set.workspace_id)
        total = await self.backlogs.total()
        return WorkspaceBacklogResponse(
            id=request.id, **ids, queued=queued, limit=self.backlogs.limit, total_queued=total
        )

    async def _fork(self, change_set: ChangeSet, request: Any, ids: dict[str, Any]) -> ForkChangeSetResponse:
        app = self._app
        if not isinstance(app, SupportsFork):
            error = f"this daemon's app ({type(app).__name__}) cannot fork change sets (it has no fork())"
            return ForkChangeSetResponse(id=request.id, **ids, error=error)
        source = ChangeSet(change_set.workspace_id, request.from_change_set_id)
        source_record = await self._store.read(source)
        if source_record is None:
            return ForkChangeSetResponse(
                id=request.id, **ids, error=f"change set {request.from_change_set_id} does not exist"
            )
        state = app.fork(change_set, source, source_record.state)
        if not await self._store.create(change_set, f"fork of {source}", state):
            return ForkChangeSetResponse(
                id=request.id, **ids, error=f"change set {change_set} already exists"
            )
        view = await app.describe(change_set, state, None) if isinstance(app, SupportsDescribe) else None
        return ForkChangeSetResponse(
            id=request.id, **ids, snapshot_address=None if view is None else view.snapshot_address
        )


# operation -> (request codec, reply codec, reply class: built with ``error`` when the request cannot be decoded)
_QUERIES: dict[str, tuple[VersionedMessage[Any], VersionedMessage[Any], type[Any]]] = {
    "get": (GET_CHANGE_SET_REQUEST, GET_CHANGE_SET_RESPONSE, GetChangeSetResponse),
    "fork": (FORK_CHANGE_SET_REQUEST, FORK_CHANGE_SET_RESPONSE, ForkChangeSetResponse),
    "reply": (GET_REPLY_REQUEST, GET_REPLY_RESPONSE, GetReplyResponse),
    "settled": (WAIT_SETTLED_REQUEST, WAIT_SETTLED_RESPONSE, WaitSettledResponse),
    "backlog": (WORKSPACE_BACKLOG_REQUEST, WORKSPACE_BACKLOG_RESPONSE, WorkspaceBacklogResponse),
}


def _asked_version(headers: Mapping[str, str] | None) -> int:
    """The version of the query (1 where the header is missing or not a number: the answer every asker reads)."""
    try:
        return int(h.get_header(headers, h.MESSAGE_VERSION) or 1)
    except ValueError:
        return 1


def _content_type(headers: Mapping[str, str] | None) -> ContentType:
    try:
        return ContentType.parse(h.get_header(headers, h.CONTENT_TYPE) or ContentType.CBOR.value)
    except Unsupported:
        return ContentType.JSON
