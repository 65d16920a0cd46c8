"""The async client: enqueue a change set's updates, optionally await the reply (an RPC over JetStream)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Self

from nats.aio.client import Client as NatsClient
from opentelemetry.trace import SpanKind, TracerProvider

from rebaser_client import _batches, _pausing, _skipping
from rebaser_client._arguments import Updates, as_id, change_set_ids, enqueue_request
from rebaser_client._backlog import BacklogCheck, ask_backlog
from rebaser_client._events import EventStream, Feed
from rebaser_client._pausing import PauseResult, ResumeResult
from rebaser_client._publisher import ClientStatus, Publisher, Sent
from rebaser_client._queries import Queries, refusal
from rebaser_client._replies import ReplyInbox
from rebaser_client._routing import Router
from rebaser_client._skipping import SkipResult
from rebaser_client._spool import SpoolConfig
from rebaser_core import headers as h
from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    ENQUEUE_UPDATES_RESPONSE,
    FORK_CHANGE_SET_REQUEST,
    FORK_CHANGE_SET_RESPONSE,
    GET_CHANGE_SET_REQUEST,
    GET_CHANGE_SET_RESPONSE,
    ContentType,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    ForkChangeSetRequest,
    ForkChangeSetResponse,
    GetChangeSetRequest,
    GetChangeSetResponse,
    StoredUpdates,
    Update,
    WaitSettledResponse,
    WorkspaceBacklogResponse,
)
from rebaser_core.batches import MAX_BATCH_BYTES, MAX_BATCH_UPDATES
from rebaser_core.errors import RebaserUnavailable
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats import speedups as nats_speedups
from rebaser_core.nats.connect import ConnectOptions, close_connection, connect, redact_url
from rebaser_core.pauses import Pause
from rebaser_core.subjects import Subjects
from rebaser_core.tracing import get_tracer, inject, recording

__all__ = ["RebaserClient", "Updates"]

_NATS_EXPECTED_STREAM = "Nats-Expected-Stream"
# The newest reply version this client reads (rebaser_core.api.enqueue_updates_response.reads_up_to).
_REPLY_VERSION, _READS = h.REPLY_VERSION, str(ENQUEUE_UPDATES_RESPONSE.current.VERSION)


class RebaserClient:
    """Talks to rebaser daemons through NATS. Use as ``async with RebaserClient(nc) as client:``.

    Args:
        nc: an open nats-py connection (not closed by the client unless it was made by :meth:`connect`).
        prefix: the deployment's subject prefix (must match the daemons').
        content_type: encoding of requests; replies come back in the same one.
        publish_timeout: how long one publish may wait (for a free slot, then for JetStream's ack) before
            ``RebaserUnavailable`` (or ``RebaserBusy(limit="in_flight")`` if no slot freed up).
        max_in_flight: requests awaiting their JetStream ack at once; bounds the client's memory while NATS is
            slow. While the connection is down, enqueues fail fast with ``RebaserUnavailable`` instead.
        spool: a local SQLite spool for requests NATS refuses (``RebaserBusy``) or cannot take
            (``RebaserUnavailable``): they are stored durably, ``enqueue_updates`` returns their id, and they are
            replayed in order once NATS takes work again. Off by default.
        streams: the number of shards the caller expects (None: whatever the cluster's layout says). It only
            guards against a mis-configured caller: if it disagrees with the cluster's layout at start,
            ``LayoutMismatch`` is raised. The client follows later layout changes by itself.
        check_workspace_backlog: refuse a request with ``RebaserBusy(limit="workspace_requests")`` while its
            workspace has the daemons' ``workspace_max_requests`` queued (counted by a daemon at most a second ago;
            see rebaser_client._backlog). On by default.
        tracer_provider: the OpenTelemetry tracer provider for the client's spans (default: the global one). Each
            request carries the W3C trace context of its ``rebaser.enqueue`` span; the daemon continues that trace.
    """

    def __init__(
        self,
        nc: NatsClient,
        *,
        prefix: str | None = None,
        content_type: ContentType = ContentType.CBOR,
        publish_timeout: float = 5.0,
        max_in_flight: int = 1024,
        spool: SpoolConfig | None = None,
        tracer_provider: TracerProvider | None = None,
        streams: int | None = None,
        check_workspace_backlog: bool = True,
    ) -> None:
        self._nc = nc
        # Faster header handling on this connection, byte for byte what nats-py does (see nats_speedups).
        nats_speedups.install(nc)
        # Spans only if the application installed an OpenTelemetry SDK (or passes a provider): see rebaser_core.tracing.
        self._tracer = get_tracer("rebaser_client", tracer_provider)
        self._tracer_provider = tracer_provider
        self._subjects = Subjects(prefix)
        self._router = Router(nc, self._subjects, streams=streams)
        self._content_type = content_type
        self._publisher = Publisher(
            nc,
            self._subjects,
            publish_timeout=publish_timeout,
            max_in_flight=max_in_flight,
            spool=spool,
            reroute=self._router.reroute,
        )
        self._owns_connection = False
        self._replies = ReplyInbox(nc)
        self._queries = Queries(nc, self._subjects, content_type)
        self._backlog = BacklogCheck(self._queries) if check_workspace_backlog else None

    @classmethod
    async def connect(cls, options: ConnectOptions | str, **kwargs: object) -> RebaserClient:
        """Open a connection (closed again by :meth:`close`) and a client on it."""
        opts = ConnectOptions(servers=(options,)) if isinstance(options, str) else options
        try:
            nc = await connect(opts)
        except Exception as err:
            servers = ", ".join(map(redact_url, opts.servers))
            raise RebaserUnavailable(f"cannot connect to NATS at {servers}: {err}") from err
        try:
            client = cls(nc, **kwargs)  # type: ignore[arg-type]
            client._owns_connection = True
            await client.start()
        except BaseException:
            await nc.close()
            raise
        return client

    async def start(self) -> None:
        """Open the spool (if configured) and start replaying what it holds. ``connect`` and ``async with`` call
        it; otherwise the first enqueue does. Reads the cluster's shard layout (LayoutMismatch if ``streams``
        disagrees with it)."""
        await self._router.start()
        await self._publisher.start()

    def status(self) -> ClientStatus:
        """The client's side of back-pressure: connection state, requests in flight, spool size, last publish."""
        return self._publisher.status()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        # First, while the connection is still open: give the spool its bounded chance to drain.
        await self._publisher.close()
        if self._backlog is not None:
            await self._backlog.close()
        await self._router.close()
        await self._replies.close()
        if self._owns_connection:
            await close_connection(self._nc)  # also during an outage

    # -- the original's API ---------------------------------------------------------------------------
    async def enqueue_updates(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        updates: Updates,
        *,
        event_session_id: str | None = None,
    ) -> RequestId:
        """Enqueue; return the request id once the request is durable: in the stream, or (with a spool, while
        NATS refuses or is unreachable) in the local spool, from which it is replayed in order."""
        request = enqueue_request(workspace_id, change_set_id, updates, None, event_session_id)
        await self._enqueue(request, None)
        return request.id

    async def enqueue_updates_from_change_set(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        from_change_set_id: ChangeSetId | str,
        updates: Updates = (),
        *,
        event_session_id: str | None = None,
    ) -> RequestId:
        """Enqueue applying ``from_change_set_id``'s changes onto ``change_set_id``."""
        request = enqueue_request(workspace_id, change_set_id, updates, from_change_set_id, event_session_id)
        await self._enqueue(request, None)
        return request.id

    async def enqueue_updates_with_reply(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        updates: Updates,
        *,
        timeout: float = 30.0,
        event_session_id: str | None = None,
    ) -> EnqueueUpdatesResponse:
        """Enqueue and wait for the outcome. ``RebaserTimeout`` if none arrives within ``timeout``."""
        request = enqueue_request(workspace_id, change_set_id, updates, None, event_session_id)
        return await self._call(request, timeout)

    async def enqueue_updates_from_change_set_with_reply(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        from_change_set_id: ChangeSetId | str,
        updates: Updates = (),
        *,
        timeout: float = 30.0,
        event_session_id: str | None = None,
    ) -> EnqueueUpdatesResponse:
        request = enqueue_request(workspace_id, change_set_id, updates, from_change_set_id, event_session_id)
        return await self._call(request, timeout)

    async def send(
        self, request: EnqueueUpdatesRequest, *, timeout: float | None = None
    ) -> EnqueueUpdatesResponse | None:
        """Send a request you built yourself (keeping its id); with ``timeout``, await its reply."""
        if timeout is None:
            await self._enqueue(request, None)
            return None
        return await self._call(request, timeout)

    # -- queries and stored batches -------------------------------------------------------------------
    async def get_change_set(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        path: str | None = None,
        *,
        timeout: float = 10.0,
    ) -> GetChangeSetResponse:
        """A change set's committed values (or one ``path``), snapshot address, and whether a DVU is pending."""
        request = GetChangeSetRequest(
            id=RequestId.new(),
            workspace_id=as_id(WorkspacePk, workspace_id, "workspace_id"),
            change_set_id=as_id(ChangeSetId, change_set_id, "change_set_id"),
            path=path,
        )
        response = await self._queries.ask(
            "get", request, GET_CHANGE_SET_REQUEST, GET_CHANGE_SET_RESPONSE, timeout
        )
        assert isinstance(response, GetChangeSetResponse)
        if response.error:
            raise refusal(response.error)
        return response

    async def workspace_backlog(
        self, workspace_id: WorkspacePk | str, *, timeout: float = 10.0
    ) -> WorkspaceBacklogResponse:
        """How many requests the workspace has queued over every shard (``queued``, as a daemon counted at most a
        second ago), and the most it may have (``limit``, the daemons' ``workspace_max_requests``; 0: none)."""
        wk = as_id(WorkspacePk, workspace_id, "workspace_id")
        return await ask_backlog(self._queries, wk, ChangeSetId.new(), timeout)

    async def fork_change_set(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        from_change_set_id: ChangeSetId | str,
        *,
        timeout: float = 10.0,
    ) -> ForkChangeSetResponse:
        """Create ``change_set_id`` as a fork of ``from_change_set_id`` at its current snapshot."""
        request = ForkChangeSetRequest(
            id=RequestId.new(),
            workspace_id=as_id(WorkspacePk, workspace_id, "workspace_id"),
            change_set_id=as_id(ChangeSetId, change_set_id, "change_set_id"),
            from_change_set_id=as_id(ChangeSetId, from_change_set_id, "from_change_set_id"),
        )
        response = await self._queries.ask(
            "fork", request, FORK_CHANGE_SET_REQUEST, FORK_CHANGE_SET_RESPONSE, timeout
        )
        assert isinstance(response, ForkChangeSetResponse)
        if response.error:
            raise refusal(response.error)
        return response

    async def wait_settled(
        self, workspace_id: WorkspacePk | str, change_set_id: ChangeSetId | str, *, timeout: float = 30.0
    ) -> WaitSettledResponse:
        """Return once the change set has no queued request and no dependent values update due, so a ``get`` shows
        the values computed from everything enqueued before this call. A daemon holds the answer until then (no
        polling here); ``RebaserTimeout`` if it is not settled within ``timeout``.

        ``dvu_pending`` may still be true in the answer when no daemon owns the change set (a DVU that kept failing
        waits for the next request): nothing will change until then."""
        return await self._queries.wait_settled(*change_set_ids(workspace_id, change_set_id), timeout)

    def watch(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str | None = None,
        *,
        since: int | Mapping[ChangeSetId, int] | None = None,
        feed: Feed = "records",
    ) -> EventStream:
        """Follow what happens to a change set (or, without ``change_set_id``, to every change set of a workspace):
        ``async for event in client.watch(wk, cs): ...`` yields :class:`~rebaser_core.api.ChangeSetEvent` in order,
        each durable event once (docs/events.md).

        ``since``: the last durable ``seq`` already seen (a mapping of them for a workspace): the feed resumes right
        after it, from what the deployment keeps (each change set's last ``events_window`` events); a gap raises
        :class:`~rebaser_core.errors.EventsLost` (iterating on goes on after it). ``None``: only what happens from
        now on. ``feed="stream"`` reads the ``REBASER_EVENTS`` stream instead (daemons with ``events`` on: notices
        too, kept longer). Use ``async with`` (or ``close()``) to stop."""
        wk = as_id(WorkspacePk, workspace_id, "workspace_id")
        cs = None if change_set_id is None else as_id(ChangeSetId, change_set_id, "change_set_id")
        return EventStream(self._nc, self._subjects, wk, cs, since, feed)

    async def store_batch(
        self,
        workspace_id: WorkspacePk | str,
        updates: Sequence[Update],
        *,
        max_updates: int = MAX_BATCH_UPDATES,
        max_bytes: int = MAX_BATCH_BYTES,
    ) -> StoredUpdates:
        """Write a (large) batch for the workspace's requests; send the result as ``updates`` of a request of that
        workspace (another workspace's request does not find it). Writing the same batch again is harmless.

        Raises :class:`~rebaser_core.errors.BatchTooLarge` (nothing stored) for a batch over ``max_updates`` or
        ``max_bytes``: by default 100,000 updates and 16 MiB, the daemons' default ``max_updates_per_request`` and
        ``max_stored_batch_bytes`` (pass theirs if they were changed)."""
        wk = as_id(WorkspacePk, workspace_id, "workspace_id")
        return await _batches.store_batch(
            self._nc, self._subjects, wk, list(updates), max_updates=max_updates, max_bytes=max_bytes
        )

    # -- operators: pausing and skipping (rebaser_client._pausing and _skipping have the rules) -------
    async def pause_change_set(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        reason: str = "",
        *,
        wait: float | None = None,
    ) -> PauseResult:
        """Pause a change set: its owner lets it go at the next request boundary, requests are still accepted. A
        change set paused already keeps its first pause (``already``). ``wait``: return only once no daemon holds
        it (``StillHeld``, a ``RebaserTimeout``, if one still does after ``wait`` seconds)."""
        wk, cs = change_set_ids(workspace_id, change_set_id)
        return await _pausing.pause_change_set(self._nc, self._subjects, wk, cs, reason, wait=wait)

    async def resume_change_set(
        self, workspace_id: WorkspacePk | str, change_set_id: ChangeSetId | str
    ) -> ResumeResult:
        """Remove the change set's pause (none: not an error) and give it a task if it has requests queued."""
        wk, cs = change_set_ids(workspace_id, change_set_id)
        return await _pausing.resume_change_set(self._nc, self._subjects, wk, cs)

    async def pause_workspace(
        self, workspace_id: WorkspacePk | str, reason: str = "", *, wait: float | None = None
    ) -> PauseResult:
        """Pause every change set of a workspace (those created later too); ``wait`` as for a change set."""
        wk = as_id(WorkspacePk, workspace_id, "workspace_id")
        return await _pausing.pause_workspace(self._nc, self._subjects, wk, reason, wait=wait)

    async def resume_workspace(self, workspace_id: WorkspacePk | str) -> ResumeResult:
        """Remove the workspace's pause and give a task to each of its change sets with requests queued."""
        wk = as_id(WorkspacePk, workspace_id, "workspace_id")
        return await _pausing.resume_workspace(self._nc, self._subjects, wk)

    async def skip_request(
        self,
        workspace_id: WorkspacePk | str,
        change_set_id: ChangeSetId | str,
        request_id: RequestId | str,
    ) -> SkipResult:
        """Move a paused change set's first queued request, which must be ``request_id``, to the dead letters
        (``NotPaused``, ``HeldByDaemon`` or ``NotFirstInLine``, all ``RebaserRefused``, and nothing done otherwise)."""
        wk, cs = change_set_ids(workspace_id, change_set_id)
        rid = as_id(RequestId, request_id, "request_id")
        return await _skipping.skip_request(self._nc, self._subjects, wk, cs, rid)

    async def pause_of(
        self, workspace_id: WorkspacePk | str, change_set_id: ChangeSetId | str
    ) -> tuple[Pause | None, Pause | None]:
        """(the change set's own pause, its workspace's pause), None where there is none: either one holds it."""
        wk, cs = change_set_ids(workspace_id, change_set_id)
        return await _pausing.pause_of(self._nc, self._subjects, wk, cs)

    # -- internals ----------------------------------------------------------------------------------
    async def _call(self, request: EnqueueUpdatesRequest, timeout: float) -> EnqueueUpdatesResponse:
        if not recording(self._tracer_provider):
            return await self._call_traced(request, timeout)
        with self._tracer.start_as_current_span(
            "rebaser.request", kind=SpanKind.CLIENT, attributes=_span_attributes(request)
        ):
            return await self._call_traced(request, timeout)

    async def _call_traced(self, request: EnqueueUpdatesRequest, timeout: float) -> EnqueueUpdatesResponse:
        async def publish(reply_inbox: str) -> bool:
            return await self._enqueue(request, reply_inbox) is Sent.DUPLICATE

        return await self._replies.call(
            request, timeout, publish, lambda future: self._queries.recorded_reply(request, future)
        )

    async def _enqueue(self, request: EnqueueUpdatesRequest, reply_inbox: str | None) -> Sent:
        await self._router.start()
        await self._router.confirm()  # never read (started disconnected, or the read failed): try once more
        # Still unknown: routing would be a guess (shard 0), so the request is spooled, or refused without a spool.
        hold = None if self._router.known else self._router.unknown_reason
        if self._backlog is not None:
            await self._backlog.check(request.workspace_id, request.change_set_id)
        names = self._router.subjects_for(request.workspace_id, request.change_set_id)
        subject = names.requests(request.workspace_id, request.change_set_id)
        headers, body = ENQUEUE_UPDATES_REQUEST.encode(request, self._content_type, reply_inbox=reply_inbox)
        headers[_NATS_EXPECTED_STREAM] = names.requests_stream
        if reply_inbox is not None:
            headers[_REPLY_VERSION] = (
                _READS  # an error reply's details (version 3) are for a client that reads them
            )
        task = names.task(request.workspace_id, request.change_set_id)
        if not recording(self._tracer_provider):
            inject(headers)  # a trace context the application carries, without spans of our own
            sent = await self._publisher.send(str(request.id), subject, headers, body, task, hold=hold)
        else:
            with self._tracer.start_as_current_span(
                "rebaser.enqueue", kind=SpanKind.PRODUCER, attributes=_span_attributes(request)
            ):
                inject(headers)  # the daemon's span for this request continues this one
                sent = await self._publisher.send(str(request.id), subject, headers, body, task, hold=hold)
        if self._backlog is not None:
            self._backlog.sent(request.workspace_id)
        return sent


def _span_attributes(request: EnqueueUpdatesRequest) -> dict[str, str]:
    return {
        "rebaser.request_id": str(request.id),
        "rebaser.workspace_id": str(request.workspace_id),
        "rebaser.change_set_id": str(request.change_set_id),
    }
