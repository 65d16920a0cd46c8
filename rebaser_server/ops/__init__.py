"""Operations: what lets an operator see and run a daemon. Metrics, logs, traces, health and ``/status``.

- :mod:`~rebaser_server.ops.observe`: the per-request instrumentation the change-set code calls (metrics, log
  context, trace spans), one object per daemon;
- :mod:`~rebaser_server.ops.metrics`: the Prometheus registry, per request and per daemon;
- :mod:`~rebaser_server.ops.logs`, :mod:`~rebaser_server.ops.tracing`: console or JSON logs, OTEL_* set-up;
- :mod:`~rebaser_server.ops.health`: the connection watch and the JetStream facts readiness rests on;
- :mod:`~rebaser_server.ops.status`: the ``/status`` document;
- :mod:`~rebaser_server.ops.http`: the health endpoint (``/healthz``, ``/readyz``, ``/status``, ``/metrics``).

Operations code reads the daemon only through :class:`~rebaser_server.ops.view.DaemonView`, a small Protocol
declared here, so it never imports the daemon and can change without touching it.

May import: ``rebaser_core`` and :mod:`rebaser_server.app`.
"""
