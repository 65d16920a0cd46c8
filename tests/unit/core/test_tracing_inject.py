"""rebaser_core.tracing.inject: the empty-context shortcut writes exactly what the propagators would."""

from __future__ import annotations

from opentelemetry import baggage, context, propagate, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from rebaser_core.tracing import inject


def test_an_empty_context_adds_no_header() -> None:
    headers: dict[str, str] = {}
    inject(headers)
    expected: dict[str, str] = {}
    propagate.inject(expected)
    assert headers == expected == {}


def test_baggage_alone_is_still_propagated() -> None:
    token = context.attach(baggage.set_baggage("tenant", "t1"))
    try:
        headers: dict[str, str] = {}
        inject(headers)
        assert headers == {"baggage": "tenant=t1"}
    finally:
        context.detach(token)


def test_a_current_span_is_propagated() -> None:
    span = NonRecordingSpan(SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(1)))
    token = context.attach(trace.set_span_in_context(span))
    try:
        headers: dict[str, str] = {}
        inject(headers)
        assert headers["traceparent"] == f"00-{0x1234:032x}-{0x5678:016x}-01"
    finally:
        context.detach(token)
