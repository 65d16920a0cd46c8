"""Trace context on the wire: W3C ``traceparent``/``tracestate`` headers on requests and replies.

Client and daemon use the OpenTelemetry API only; whether spans are recorded and where they go is the
application's choice (an SDK ``TracerProvider``; the daemon sets one up from the standard ``OTEL_*`` variables, see
``rebaser_server.ops.tracing``). Without one every call here is a cheap no-op and no header is added, and a peer that
sends no trace headers is served all the same: its request starts a trace of its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["TRACE_HEADERS", "extract", "get_tracer", "inject", "recording"]

# OpenTelemetry can name a tracer provider class in the environment; then it is made on first use.
_PROVIDER_FROM_ENV = bool(os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"))
# The headers the default (W3C trace context) propagator reads and writes.
TRACE_HEADERS = ("traceparent", "tracestate")
_DEFAULTS = {TraceContextTextMapPropagator, W3CBaggagePropagator}


def get_tracer(name: str, provider: trace.TracerProvider | None = None) -> trace.Tracer:
    """A tracer of ``provider``, or of the global provider (no-op until an application installs one)."""
    return trace.get_tracer(name, tracer_provider=provider)


def recording(provider: trace.TracerProvider | None = None) -> bool:
    """Whether spans of ``provider`` (or of the global provider) go anywhere. Without an SDK every span is a no-op
    that returns the current span, so code that only starts spans may skip them when this is False (saving the
    context switches); what ``inject`` propagates stays the same."""
    if provider is None:
        # trace.get_tracer_provider() reads the environment on every call until a provider is set (a few percent
        # of a client's CPU when asked per request); the global it sets is read directly while that is cheaper.
        provider = getattr(trace, "_TRACER_PROVIDER", None)
        if provider is None:
            if not _PROVIDER_FROM_ENV:
                return False
            provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.NoOpTracerProvider | trace.ProxyTracerProvider)


def inject(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Add the trace context (the current span's, or ``context``'s) to message headers; nothing if none."""
    if context is None and not otel_context.get_current() and _default_propagators():
        # An empty context (no span, no baggage: an application without tracing) gives the default propagators
        # nothing to write; asking them anyway costs a few microseconds per request.
        return
    propagate.inject(headers, context=context)


def _default_propagators() -> bool:
    """Whether the global propagator is OpenTelemetry's default (W3C trace context and baggage, nothing else).
    Worked out once per global propagator: an application may replace it, but not on every request."""
    textmap = propagate.get_global_textmap()
    if _checked[0] is not textmap:
        parts = getattr(textmap, "_propagators", None)
        _checked[:] = [
            textmap,
            isinstance(textmap, CompositePropagator)
            and parts is not None
            and {type(p) for p in parts} <= _DEFAULTS,
        ]
    return bool(_checked[1])


# [the global propagator last looked at, whether it is the default]
_checked: list[object] = [None, False]


def extract(headers: Mapping[str, str] | None) -> Context:
    """The trace context a message carries (an empty context if it carries none)."""
    return propagate.extract(dict(headers or {}))
