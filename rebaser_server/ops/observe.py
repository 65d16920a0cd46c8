"""What the daemon records about its work: metrics, log context and trace spans.

The processor calls three hooks; everything else about observability reads the daemon's state from outside
(``rebaser_server.ops.metrics``):

- :meth:`Observer.own` where the daemon takes a change set's task (``Daemon._take``): a ``rebaser.take`` span for
  the whole ownership, current in the task that owns it;
- :meth:`Observer.request` around the handling of each request delivery (``ChangeSetProcessor._on_request``):
  the queue-wait and processing-time histograms, the request's ids on every log line, and a ``rebaser.request``
  span continuing the caller's trace (from the request's ``traceparent`` header), linked to the take. It starts
  when the request arrived in the stream, so its first child, ``rebaser.queue_wait``, shows the wait;
- :meth:`Observer.phase` around the request's steps: ``rebaser.apply`` (``handling``);
- :meth:`Observer.commit` around a commit group's write (``group``): a ``rebaser.commit`` span in the trace of the
  group's last request, linked to the others (:meth:`Observer.staged` remembers them);
- :meth:`Observer.reply` around each reply (``replies``): a ``rebaser.reply`` span under the request it answers,
  whose trace context the reply carries back;
- :meth:`Observer.dvu` around each DVU run (``ChangeSetDvu._run``): a ``rebaser.dvu`` span in the trace
  of the request whose commit made the DVU due (:meth:`Observer.dvu_due`, called by the commit group).

Tracing is off unless the application installed an SDK: then no span context is valid, and every hook returns after
one context lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind

from rebaser_core import headers as h
from rebaser_core.tracing import extract, get_tracer, inject, recording
from rebaser_server.app import ChangeSet
from rebaser_server.ops.logs import pop_log_ids, push_log_ids
from rebaser_server.ops.metrics import RequestMetrics

__all__ = ["Observer"]

# What the span hooks return when tracing is off: reusable, and the cheapest context manager there is.
_NO_SPAN = contextlib.nullcontext()
TRACEPARENT = "traceparent"
# Span contexts of recent requests, by request id, for their replies (a group's replies go out after its spans).
_RECENT_REQUESTS = 4096


class Observer:
    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.metrics = RequestMetrics()
        self.set_tracer_provider(tracer_provider)
        self._requests: OrderedDict[str, trace.SpanContext] = OrderedDict()
        self._dvu_due: OrderedDict[ChangeSet, trace.SpanContext] = OrderedDict()

    def set_tracer_provider(self, provider: trace.TracerProvider | None) -> None:
        """Record spans with ``provider`` (None: the global one, a no-op unless the application installed one)."""
        self.tracer = get_tracer("rebaser_server", provider)
        self._provider = provider

    def _tracing(self) -> bool:
        """Whether spans go anywhere. Without a provider every span is a no-op, but building one (attributes,
        the caller's context, a context switch) costs a few percent of a daemon's CPU per request: skipped then."""
        return recording(self._provider)

    @staticmethod
    def _ids(change_set: ChangeSet) -> dict[str, str]:
        return {
            "rebaser.workspace_id": str(change_set.workspace_id),
            "rebaser.change_set_id": str(change_set.change_set_id),
        }

    # -- take -------------------------------------------------------------------------------------
    def own(self, change_set: ChangeSet, start: Callable[[], asyncio.Task[Any]]) -> asyncio.Task[Any]:
        """Start the task that owns ``change_set`` (``start``) inside a ``rebaser.take`` span, ended with it."""
        if not self._tracing():
            return start()
        span = self.tracer.start_span(
            "rebaser.take", kind=SpanKind.CONSUMER, attributes=self._ids(change_set)
        )
        with trace.use_span(span, end_on_exit=False):
            task = start()  # copies the context: the span is current in the owning task and what it starts
        task.add_done_callback(lambda _t: span.end())
        return task

    # -- requests ---------------------------------------------------------------------------------
    def request(
        self, msg: Msg, change_set: ChangeSet, stored_at: float | None
    ) -> AbstractContextManager[None]:
        """Around the handling of one request delivery (also when it fails); ``stored_at``: when the stream stored
        it (seconds since the epoch, the server's clock), if known."""
        headers = msg.headers or {}
        if not self._tracing() and TRACEPARENT not in headers:
            # Nothing to record and no caller's trace to pass on to the reply: logs and metrics only, in one plain
            # object (nested generator context managers cost a few percent of a daemon's CPU per request).
            return _Measured(self.metrics, headers.get(h.NATS_MSG_ID), change_set, stored_at)
        return self._traced(msg, change_set, headers, stored_at)

    @contextlib.contextmanager
    def _traced(
        self, msg: Msg, change_set: ChangeSet, headers: dict[str, str], arrived: float | None
    ) -> Iterator[None]:
        request_id = headers.get(h.NATS_MSG_ID)
        take = trace.get_current_span().get_span_context()
        attributes: dict[str, Any] = {**self._ids(change_set), "messaging.destination.name": msg.subject}
        if request_id:
            attributes["rebaser.request_id"] = request_id
        started: int | None = None  # the request's arrival, when known (ns since the epoch)
        if arrived is not None:
            now = time.time_ns()
            wait = max(0.0, now / 1e9 - arrived)  # a server clock ahead of ours counts as no wait
            attributes["rebaser.queue_wait_seconds"] = wait
            started = now - int(wait * 1e9)
        with (
            _Measured(self.metrics, request_id, change_set, arrived),
            # The caller's trace (a foreign client that sends none starts one here), linked to the ownership.
            self.tracer.start_as_current_span(
                "rebaser.request",
                context=extract(headers),
                kind=SpanKind.CONSUMER,
                attributes=attributes,
                links=[Link(take)] if take.is_valid else None,
                start_time=started,
            ) as span,
        ):
            if started is not None and span.is_recording():
                self.tracer.start_span("rebaser.queue_wait", start_time=started).end()
            context = span.get_span_context()
            if request_id and context.is_valid:  # valid only when spans are recorded: nothing kept otherwise
                self._requests[request_id] = context
                while len(self._requests) > _RECENT_REQUESTS:
                    self._requests.popitem(last=False)
            yield

    def phase(self, name: str) -> AbstractContextManager[object]:
        """A child span of the request being handled for one of its steps (nothing when tracing is off)."""
        if not trace.get_current_span().get_span_context().is_valid:
            return _NO_SPAN
        return self.tracer.start_as_current_span(name, kind=SpanKind.INTERNAL)

    @staticmethod
    def staged() -> trace.SpanContext | None:
        """The span of the request being handled, for the commit that will include it (None: tracing is off)."""
        context = trace.get_current_span().get_span_context()
        return context if context.is_valid else None

    def commit(
        self, change_set: ChangeSet, requests: Sequence[trace.SpanContext]
    ) -> AbstractContextManager[object]:
        """Around the commit of a group: in the trace of its last request, linked to the others'.

        Its own parent, not the current span: a group may be committed by a timer, after its requests' spans ended.
        """
        if not requests:
            return _NO_SPAN
        return self.tracer.start_as_current_span(
            "rebaser.commit",
            context=trace.set_span_in_context(trace.NonRecordingSpan(requests[-1])),
            kind=SpanKind.INTERNAL,
            attributes={**self._ids(change_set), "rebaser.group_size": len(requests)},
            links=[Link(c) for c in requests[:-1]],
        )

    def reply(
        self, request_headers: MutableMapping[str, str], reply_headers: dict[str, str]
    ) -> AbstractContextManager[object]:
        """Around the publish of a reply: a ``rebaser.reply`` span under the request it answers, whose trace
        context goes on the reply."""
        if not self._requests:  # tracing off: nothing remembered
            return _NO_SPAN
        request_id = request_headers.get(h.NATS_MSG_ID)
        context = self._requests.pop(request_id, None) if request_id else None
        if context is None:
            return _NO_SPAN
        return self._reply_span(request_id or "", context, reply_headers)

    @contextlib.contextmanager
    def _reply_span(
        self, request_id: str, request: trace.SpanContext, reply_headers: dict[str, str]
    ) -> Iterator[None]:
        with self.tracer.start_as_current_span(
            "rebaser.reply",
            context=trace.set_span_in_context(trace.NonRecordingSpan(request)),
            kind=SpanKind.PRODUCER,
            attributes={"rebaser.request_id": request_id},
        ):
            inject(reply_headers)  # this span's context: the caller's trace, continued
            yield

    # -- dependent values update ------------------------------------------------------------------
    def dvu_due(self, change_set: ChangeSet, cause: trace.SpanContext | None = None) -> None:
        """A commit made a DVU due: its run joins the trace of ``cause`` (the group's last request), else of the
        request being handled now."""
        current = cause or trace.get_current_span().get_span_context()
        if current.is_valid:
            self._dvu_due[change_set] = current
            while len(self._dvu_due) > _RECENT_REQUESTS:  # change sets lost before their DVU ran
                self._dvu_due.popitem(last=False)

    @contextlib.asynccontextmanager
    async def dvu(self, change_set: ChangeSet) -> AsyncIterator[None]:
        """Around one DVU run."""
        cause = self._dvu_due.pop(change_set, None)
        context = trace.set_span_in_context(trace.NonRecordingSpan(cause)) if cause is not None else None
        # A failure is recorded on the span (exception event, error status) by start_as_current_span itself.
        with self.tracer.start_as_current_span(
            "rebaser.dvu", context=context, kind=SpanKind.INTERNAL, attributes=self._ids(change_set)
        ):
            yield


class _Measured:
    """The request's ids on every log line, and its queue-wait and processing-time metrics."""

    __slots__ = ("_arrived", "_change_set", "_metrics", "_request_id", "_started", "_token")

    def __init__(
        self,
        metrics: RequestMetrics,
        request_id: str | None,
        change_set: ChangeSet,
        arrived: float | None,
    ) -> None:
        self._metrics = metrics
        self._request_id = request_id
        self._change_set = change_set
        self._arrived = arrived

    def __enter__(self) -> None:
        change_set = self._change_set
        self._started = self._metrics.started(self._arrived)
        # Pushed last and popped in a finally: nothing can leave the ids bound to the next request.
        self._token = push_log_ids(
            request_id=self._request_id,
            workspace_id=str(change_set.workspace_id),
            change_set_id=str(change_set.change_set_id),
        )

    def __exit__(self, *_exc: object) -> None:
        try:
            self._metrics.ended(self._started)
        finally:
            pop_log_ids(self._token)
