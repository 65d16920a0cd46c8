"""Tracing: one trace from the caller's span through the client, the daemon's request and the DVU it caused; the
reply carries the trace context back; a request without trace headers is served and starts its own trace; the
daemon's set-up from the OTEL_* variables."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator

import pytest
from nats.aio.client import Client as NatsClient
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.ops.tracing import TracingError, configure_tracing
from rebaser_server.testing import CheckpointGate, fast_settings, running_daemon
from tests.support.apps import RecordingApp


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A tracer provider of the test's own (the global one stays untouched), recording in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


async def test_one_trace_across_client_daemon_and_dvu(
    nc: NatsClient, subject_prefix: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon:
        daemon.observe.set_tracer_provider(provider)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        async with RebaserClient(nc, prefix=subject_prefix, tracer_provider=provider) as client:
            with provider.get_tracer("test").start_as_current_span("caller") as caller:
                reply = await client.enqueue_updates_with_reply(
                    wk, cs, [SetLiteral(path="/dvu", value=True)], timeout=10
                )
            assert reply.ok

            await wait_for(lambda: named(exporter, "rebaser.dvu"), timeout=10, message="the DVU span ended")
            expected = caller.get_span_context().trace_id
            requests = named(exporter, "rebaser.request")  # the client's and the daemon's, by kind
            (client_request,) = [s for s in requests if s.kind is trace.SpanKind.CLIENT]
            daemon_requests = [s for s in requests if s.kind is trace.SpanKind.CONSUMER]
            enqueue = [s for s in named(exporter, "rebaser.enqueue") if trace_id(s) == expected]
            assert len(enqueue) == 1 and len(daemon_requests) == 1
            (request,) = daemon_requests
            (dvu,) = named(exporter, "rebaser.dvu")
            assert {trace_id(client_request), trace_id(request), trace_id(dvu)} == {expected}
            # Parent chain: caller -> client request -> enqueue -> daemon request -> DVU.
            assert request.parent is not None and request.parent.span_id == enqueue[0].context.span_id  # type: ignore[union-attr]
            assert dvu.parent is not None and dvu.parent.span_id == request.context.span_id  # type: ignore[union-attr]
            assert request.attributes is not None
            assert request.attributes["rebaser.request_id"] == str(reply.id)
            assert request.attributes["rebaser.change_set_id"] == str(cs)
            assert "rebaser.queue_wait_seconds" in request.attributes
            # Linked to the take, whose span lasts as long as the ownership.
            assert request.links and len(request.links) == 1

            # The reply carries the request's trace context back.
            inbox = client._replies.prefix
            assert inbox is not None
            replies = await nc.subscribe(f"{inbox}.*")
            try:
                with provider.get_tracer("test").start_as_current_span("second") as second:
                    await client.enqueue_updates_with_reply(
                        wk, cs, [SetLiteral(path="/b", value=1)], timeout=10
                    )
                msg = await replies.next_msg(timeout=5)
            finally:
                await replies.unsubscribe()
            traceparent = (msg.headers or {}).get("traceparent", "")
            assert traceparent.split("-")[1] == f"{second.get_span_context().trace_id:032x}"

        async def taken_and_released() -> list[ReadableSpan]:
            return named(exporter, "rebaser.take")

        takes = await wait_for(taken_and_released, timeout=10, message="the take span ended with the release")
        assert request.links[0].context.span_id == takes[0].context.span_id  # type: ignore[union-attr]


async def test_a_request_without_trace_headers_starts_its_own_trace(
    nc: NatsClient, subject_prefix: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon:
        daemon.observe.set_tracer_provider(provider)
        # The client records nothing (no SDK installed globally): it sends no trace headers, like a foreign client.
        async with RebaserClient(nc, prefix=subject_prefix) as client:
            reply = await client.enqueue_updates_with_reply(
                WorkspacePk.new(), ChangeSetId.new(), [SetLiteral(path="/a", value=1)], timeout=10
            )
        assert reply.ok
        (request,) = named(exporter, "rebaser.request")
        assert request.parent is None  # a root: no caller trace to continue
        assert request.attributes is not None and request.attributes["rebaser.request_id"] == str(reply.id)


def test_tracing_is_off_unless_asked_for() -> None:
    assert configure_tracing({}) is None
    assert configure_tracing({"OTEL_TRACES_EXPORTER": "none"}) is None
    assert configure_tracing({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}) is None
    with pytest.raises(TracingError, match="'zipkin' is not one of"):
        configure_tracing({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(TracingError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        configure_tracing({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"})
    try:
        installed = importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is not None
    except ModuleNotFoundError:
        installed = False
    if not installed:
        with pytest.raises(TracingError, match=r"rebaser\[otlp\]"):
            configure_tracing({"OTEL_TRACES_EXPORTER": "otlp"})


async def test_a_request_has_spans_for_queue_wait_apply_commit_and_reply(
    nc: NatsClient, subject_prefix: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon:
        daemon.observe.set_tracer_provider(provider)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        async with RebaserClient(nc, prefix=subject_prefix, tracer_provider=provider) as client:
            # A first request makes the client's reply inbox.
            assert (await client.enqueue_updates_with_reply(wk, ChangeSetId.new(), [], timeout=10)).ok
            exporter.clear()
            replies = await nc.subscribe(f"{client._replies.prefix}.*")
            try:
                reply = await client.enqueue_updates_with_reply(
                    wk, cs, [SetLiteral(path="/a", value=1)], timeout=10
                )
                msg = await replies.next_msg(timeout=5)
            finally:
                await replies.unsubscribe()
        assert reply.ok
        await wait_for(lambda: named(exporter, "rebaser.reply"), timeout=10, message="the reply span ended")

    (request,) = [
        s
        for s in named(exporter, "rebaser.request")
        if s.kind is trace.SpanKind.CONSUMER
        and s.attributes
        and s.attributes["rebaser.change_set_id"] == str(cs)
    ]
    assert request.context is not None and request.start_time is not None
    children = {
        s.name: s
        for s in exporter.get_finished_spans()
        if s.parent and s.parent.span_id == request.context.span_id
    }
    assert {"rebaser.queue_wait", "rebaser.apply", "rebaser.commit", "rebaser.reply"} <= set(children)
    # The request span starts when the request arrived in the stream: its queue wait comes first.
    wait = children["rebaser.queue_wait"]
    assert wait.start_time == request.start_time
    assert wait.end_time is not None and children["rebaser.apply"].start_time is not None
    assert wait.end_time <= children["rebaser.apply"].start_time
    commit = children["rebaser.commit"]
    assert commit.attributes is not None and commit.attributes["rebaser.group_size"] == 1
    assert commit.attributes["rebaser.change_set_id"] == str(cs)
    # The reply carries the trace context of its own span, in the caller's trace.
    reply_span = children["rebaser.reply"]
    assert reply_span.context is not None and reply_span.kind is trace.SpanKind.PRODUCER
    _version, trace_hex, span_hex, _flags = (msg.headers or {})["traceparent"].split("-")
    assert (int(trace_hex, 16), int(span_hex, 16)) == (request.context.trace_id, reply_span.context.span_id)


async def test_a_group_commit_span_covers_each_request_of_the_group_once(
    nc: NatsClient, subject_prefix: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    # The daemon waits at "acquired" (owner, not yet consuming) until all the requests are queued: they are then
    # delivered with more waiting behind them, which is what makes the daemon commit them as groups.
    gate = CheckpointGate("acquired")
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp(), hooks=gate) as daemon:
        daemon.observe.set_tracer_provider(provider)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        async with RebaserClient(nc, prefix=subject_prefix, tracer_provider=provider) as client:
            calls = [
                asyncio.create_task(
                    client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=0)], timeout=20)
                )
            ]
            await gate.wait_reached()
            for n in range(1, 6):
                await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=n)])
            gate.release()
            assert (await calls[0]).ok
            await wait_for(
                lambda: len(named(exporter, "rebaser.request")) >= 7, timeout=20, message="all were handled"
            )

    requests = [s for s in named(exporter, "rebaser.request") if s.kind is trace.SpanKind.CONSUMER]
    assert len(requests) == 6
    covered: list[int] = []
    for commit in named(exporter, "rebaser.commit"):
        assert commit.parent is not None and commit.attributes is not None
        group = [commit.parent.span_id, *(link.context.span_id for link in commit.links)]
        assert commit.attributes["rebaser.group_size"] == len(group)
        covered += group
    assert sorted(covered) == sorted(s.context.span_id for s in requests if s.context)
