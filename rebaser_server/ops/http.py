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

It binds 127.0.0.1 by default. ``/status`` and ``/metrics`` name workspaces and change sets, so they are for operators
only; ``/healthz`` and ``/readyz`` say nothing of anyone's work and stay open to every prober:

* with a token (``--http-token``, ``--http-token-file``), ``/status`` and ``/metrics`` want
  ``Authorization: Bearer <token>`` from every peer, else 401 (Prometheus: ``authorization: {credentials_file: …}``);
* without one, bound to a loopback address, they answer every peer (only this host can connect);
* without one, bound to any other address (the container image binds 0.0.0.0), they answer 403 to any peer that is
  not this host: exposing them takes a token.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from rebaser_server.ops.daemon_metrics import DaemonCollector
from rebaser_server.ops.metrics import CONTENT_TYPE_LATEST, render
from rebaser_server.ops.status import status_of
from rebaser_server.ops.view import DaemonView

__all__ = ["DEFAULT_HTTP_HOST", "DEFAULT_HTTP_PORT", "HealthServer", "is_loopback"]

log = logging.getLogger(__name__)

DEFAULT_HTTP_HOST = "127.0.0.1"
# Not 9090: that is Prometheus's own port, and a Prometheus beside the daemon is what scrapes it. 9464 is the
# port the OpenTelemetry Prometheus exporter uses by convention.
DEFAULT_HTTP_PORT = 9464

_DAEMON: web.AppKey[DaemonView] = web.AppKey("daemon")
# Open to every peer whatever the token: they show only whether the daemon is alive and ready.
_PROBES = frozenset({"/healthz", "/readyz"})
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an address or ``localhost``) is this host only: 127.0.0.0/8, ::1 (or IPv4-mapped)."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]").partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _operators_only(token: str | None, host: str) -> Middleware:
    """The middleware keeping every path but the probes to operators (see the module's doc)."""
    expected = None if token is None else f"Bearer {token}".encode()
    local_only = token is None and not is_loopback(host)

    @web.middleware
    async def guard(request: web.Request, handler: _Handler) -> web.StreamResponse:
        if request.path in _PROBES:
            return await handler(request)
        if expected is not None:
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return web.json_response(
                    {"error": "this endpoint wants the daemon's HTTP token: Authorization: Bearer <token>"},
                    status=401,
                    headers={"WWW-Authenticate": 'Bearer realm="rebaser"'},
                )
        elif local_only and not is_loopback(request.remote):
            return web.json_response(
                {
                    "error": f"{request.path} names workspaces: it answers other hosts only with a token "
                    "(--http-token or --http-token-file, REBASER_HTTP_TOKEN or REBASER_HTTP_TOKEN_FILE)"
                },
                status=403,
            )
        return await handler(request)

    return guard


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
    """``await HealthServer(daemon, port=0).start()`` serves the endpoints; ``port`` 0 picks a free one. ``token``:
    what ``/status`` and ``/metrics`` want as ``Authorization: Bearer <token>`` (None: see the module's doc)."""

    def __init__(
        self,
        daemon: DaemonView,
        *,
        host: str = DEFAULT_HTTP_HOST,
        port: int = DEFAULT_HTTP_PORT,
        token: str | None = None,
    ) -> None:
        if token is not None and not token.strip():
            raise ValueError("the HTTP token is empty")
        app = web.Application(middlewares=[_operators_only(token, host)])
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
        # How /status and /metrics are kept to operators, for the start-up line.
        self.access = (
            "/status and /metrics want the HTTP token"
            if token is not None
            else "/status and /metrics answer this host only: give --http-token to expose them"
            if not is_loopback(host)
            else "/status and /metrics for this host"
        )
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
