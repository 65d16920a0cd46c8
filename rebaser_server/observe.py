"""What the daemon records about its work: metrics, log context and trace spans.

The processor calls three hooks; everything else about observability reads the daemon's state from outside
(``rebaser_server.metrics``):

- :meth:`Observer.own` where the daemon takes a change set's task (``Daemon._take``): a ``rebaser.take`` span for
  the whole ownership, current in the task that owns it;
- :meth:`Observer.request` around the handling of each request delivery (``ChangeSetProcessor._on_request``):
  the queue-wait and processing-time histograms, the request's ids on every log line, and a ``rebaser.request``
  span continuing the caller's trace (from the request's ``traceparent`` header), linked to the take;
- :meth:`Observer.dvu` around each DVU run (``ChangeSetProcessor._run_dvu``): a ``rebaser.dvu`` span in the trace
  of the request whose commit made the DVU due (:meth:`Observer.dvu_due`, called by the commit group).

Replies carry the trace context of the request they answer (:meth:`Observer.reply_headers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from typing import Any

from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind

from rebaser_core import headers as h
from rebaser_core.tracing import extract, get_tracer, inject, recording
from rebaser_server.app import ChangeSet
from rebaser_server.logs import bind_request
from rebaser_server.metrics import RequestMetrics, arrival_of

__all__ = ["Observer"]

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
        the caller's context, a context switch) was a few percent of a daemon's CPU per request: skipped then."""
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
    @contextlib.contextmanager
    def request(self, msg: Msg, change_set: ChangeSet) -> Iterator[None]:
        """Around the handling of one request delivery (also when it fails)."""
        headers = msg.headers or {}
        request_id = headers.get(h.NATS_MSG_ID)
        arrived = arrival_of(msg)
        if not self._tracing() and TRACEPARENT not in headers:
            # Nothing to record and no caller's trace to pass on to the reply: logs and metrics only.
            with (
                bind_request(
                    request_id=request_id,
                    workspace_id=str(change_set.workspace_id),
                    change_set_id=str(change_set.change_set_id),
                ),
                self.metrics.request(arrived),
            ):
                yield
            return
        take = trace.get_current_span().get_span_context()
        attributes: dict[str, Any] = {**self._ids(change_set), "messaging.destination.name": msg.subject}
        if request_id:
            attributes["rebaser.request_id"] = request_id
        if arrived is not None:
            attributes["rebaser.queue_wait_seconds"] = max(0.0, time.time() - arrived.timestamp())
        with (
            bind_request(
                request_id=request_id,
                workspace_id=str(change_set.workspace_id),
                change_set_id=str(change_set.change_set_id),
            ),
            self.metrics.request(arrived),
            # The caller's trace (a foreign client that sends none starts one here), linked to the ownership.
            self.tracer.start_as_current_span(
                "rebaser.request",
                context=extract(headers),
                kind=SpanKind.CONSUMER,
                attributes=attributes,
                links=[Link(take)] if take.is_valid else None,
            ) as span,
        ):
            context = span.get_span_context()
            if request_id and context.is_valid:  # valid only when spans are recorded: nothing kept otherwise
                self._requests[request_id] = context
                while len(self._requests) > _RECENT_REQUESTS:
                    self._requests.popitem(last=False)
            yield

    def reply_headers(self, request_headers: MutableMapping[str, str], reply_headers: dict[str, str]) -> None:
        """Put the trace context of the request being answered on its reply."""
        request_id = request_headers.get(h.NATS_MSG_ID)
        context = self._requests.pop(request_id, None) if request_id else None
        if context is not None:
            inject(reply_headers, trace.set_span_in_context(trace.NonRecordingSpan(context)))

    # -- dependent values update ------------------------------------------------------------------
    def dvu_due(self, change_set: ChangeSet) -> None:
        """A commit made a DVU due: its run joins the trace of the request being handled now (the last one)."""
        current = trace.get_current_span().get_span_context()
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
