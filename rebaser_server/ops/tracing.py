"""The daemon's tracing set-up from the standard OpenTelemetry variables; off unless asked for.

``OTEL_TRACES_EXPORTER`` (comma-separated) picks the exporters: ``console`` (spans printed to stderr, for
development), ``otlp`` (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_PROTOCOL`` ``http/protobuf`` or
``grpc``; needs the ``rebaser[otlp]`` extra), ``none``. Unset, or ``OTEL_SDK_DISABLED=true``: no tracing at all.
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name the daemon, and the batch processor reads its own
``OTEL_BSP_*`` variables.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

__all__ = ["TracingError", "configure_tracing"]

_OTLP_EXPORTERS = {
    "http/protobuf": (
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "opentelemetry-exporter-otlp-proto-http",
    ),
    "grpc": (
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "opentelemetry-exporter-otlp-proto-grpc",
    ),
}


class TracingError(Exception):
    """The OTEL_* variables ask for something this installation cannot do (a one-line error for the operator)."""


def _otlp_exporter(environ: Mapping[str, str]) -> SpanExporter:
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol not in _OTLP_EXPORTERS:
        raise TracingError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} is not one of {', '.join(_OTLP_EXPORTERS)}"
        )
    module_name, package = _OTLP_EXPORTERS[protocol]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise TracingError(
            f"OTEL_TRACES_EXPORTER=otlp needs {package} (pip install 'rebaser[otlp]')"
        ) from None
    exporter: SpanExporter = (
        module.OTLPSpanExporter()
    )  # endpoint, headers, timeout: from OTEL_EXPORTER_OTLP_*
    return exporter


def configure_tracing(environ: Mapping[str, str] | None = None) -> TracerProvider | None:
    """Install a global tracer provider as the ``OTEL_*`` variables say; None when tracing is off. The caller
    shuts the provider down at exit (which flushes the spans still batched)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    names = [n for n in names if n != "none"]
    if not names:
        return None
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            exporters.append(_otlp_exporter(env))
        else:
            raise TracingError(f"OTEL_TRACES_EXPORTER {name!r} is not one of console, otlp, none")
    resource = Resource.create()  # reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "rebaser-server"}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider
