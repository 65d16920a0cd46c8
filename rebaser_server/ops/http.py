"""The daemon's health endpoint (aiohttp), kept thin: every answer comes from the daemon,
read through :class:`~rebaser_server.ops.view.DaemonView`.

============  ==============================================================================================
``/healthz``  200 while the daemon's event loop answers and its loops run; 503 if one has died (restart it)
``/readyz``   200 when connected, streams present and not shutting down; 503 with the reasons when the backlog
              is over ``ready_max_backlog``, NATS has been unreachable over ``ready_max_disconnected``, or
              it is shutting down
``/status``   JSON: owned change sets, tasks waiting and unacked, requests waiting, dead letters, the last
              request and write times, the NATS connection, and the daemon's counters
``/metrics``  the same counters and backlog, plus latency histograms, in Prometheus text format
              (``rebaser_server.ops.metrics``)
============  ==============================================================================================

It binds 127.0.0.1 by default: the status page names change sets, so exposing it is a deliberate choice.
"""

from __future__ import annotations

import logging

from aiohttp import web

from rebaser_server.ops.daemon_metrics import DaemonCollector
from rebaser_server.ops.metrics import CONTENT_TYPE_LATEST, render
from rebaser_server.ops.status import status_of
from rebaser_server.ops.view import DaemonView

__all__ = ["DEFAULT_HTTP_HOST", "DEFAULT_HTTP_PORT", "HealthServer"]

log = logging.getLogger(__name__)

DEFAULT_HTTP_HOST = "127.0.0.1"
# Not 9090: that is Prometheus's own port, and a Prometheus beside the daemon is what scrapes it. 9464 is the
# port the OpenTelemetry Prometheus exporter uses by convention.
DEFAULT_HTTP_PORT = 9464

_DAEMON: web.AppKey[DaemonView] = web.AppKey("daemon")


async def _healthz(request: web.Request) -> web.Response:
    problem = request.app[_DAEMON].alive()
    if problem is None:
        return web.json_response({"alive": True})
    return web.json_response({"alive": False, "reason": problem}, status=503)


async def _readyz(request: web.Request) -> web.Response:
    status = await status_of(request.app[_DAEMON])
    body = {"ready": status["ready"], "not_ready": status["not_ready"]}
    return web.json_response(body, status=200 if status["ready"] else 503)


async def _status(request: web.Request) -> web.Response:
    return web.json_response(await status_of(request.app[_DAEMON]))


async def _metrics(request: web.Request) -> web.Response:
    daemon = request.app[_DAEMON]
    await daemon.health.facts()  # refresh the backlog gauges (cached: at most one JetStream fetch a second)
    # As a raw header: aiohttp's content_type argument refuses parameters (the format version, the charset).
    return web.Response(body=render(daemon.observe.metrics), headers={"Content-Type": CONTENT_TYPE_LATEST})


class HealthServer:
    """``await HealthServer(daemon, port=0).start()`` serves the endpoints; ``port`` 0 picks a free one."""

    def __init__(
        self, daemon: DaemonView, *, host: str = DEFAULT_HTTP_HOST, port: int = DEFAULT_HTTP_PORT
    ) -> None:
        app = web.Application()
        app[_DAEMON] = daemon
        app.router.add_get("/healthz", _healthz)
        app.router.add_get("/readyz", _readyz)
        app.router.add_get("/status", _status)
        app.router.add_get("/metrics", _metrics)
        daemon.observe.metrics.bind(DaemonCollector(daemon))
        # No access log: probers call every few seconds and would drown the daemon's own log.
        self._runner = web.AppRunner(app, access_log=None)
        self._host = host
        self._port = port
        self._site: web.TCPSite | None = None

    async def start(self) -> None:
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self._host, self._port)
        try:
            await self._site.start()
        except BaseException:
            await self._runner.cleanup()
            raise
        log.debug("health endpoint on %s", self.url)  # the CLI prints it for users; once is enough

    @property
    def port(self) -> int:
        """The bound port (the one picked when started with port 0)."""
        addresses = self._runner.addresses
        if not addresses:
            raise RuntimeError("the health server is not started")
        return int(addresses[0][1])

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        await self._runner.cleanup()
