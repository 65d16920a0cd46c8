"""Serving: what ``rebaser-server`` does once its flags are read. Load the app, start the embedded nats-server if
no ``--nats-url`` was given, connect, start the health endpoint and the daemon, and stop it all in order."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import gc
import logging

import click
import nats.errors
from nats.aio.client import Client as NatsClient

from rebaser_core.embedded import NatsServer
from rebaser_core.nats.connect import ConnectOptions, close_connection, connect, redact_url
from rebaser_core.nats.durability import describe_sync
from rebaser_server.app import RebaserApp, load_app
from rebaser_server.cli.signals import install_signal_handlers
from rebaser_server.daemon.config import ServerConfig
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.devtools.embedded_start import start_embedded
from rebaser_server.ops.http import HealthServer

__all__ = ["serve", "tune_gc"]

log = logging.getLogger("rebaser_server")


async def serve(config: ServerConfig, *, demo: bool = False) -> int:
    app = _load_app(config.app)  # before anything is started: a typo in --app is the commonest mistake
    embedded: NatsServer | None = None
    options = config.connect
    if options is None:
        embedded = _start_embedded(config)
        options = ConnectOptions(servers=(embedded.url,), name="rebaser-server")
        if embedded.monitoring_url is not None and not config.settings.nats_monitoring_urls:
            # The daemon reads the sync setting back from the server, rather than trusting the flag it was given.
            settings = config.settings.model_copy(update={"nats_monitoring_urls": (embedded.monitoring_url,)})
            config = dataclasses.replace(config, settings=settings)
    # Shutdown runs in this order, also when starting fails half-way: the daemon hands its change sets back (each
    # hand-back confirmed by the server, see rebaser_server.task.handback), the connection is drained (which flushes
    # the last replies), and only then is the embedded server stopped, gracefully, so that it stores all of it.
    try:
        nc = await _connect(options)
        http: HealthServer | None = None
        starting: Daemon | None = None  # set once it may have taken tasks
        try:
            daemon = Daemon(nc, config.settings, app)
            tune_gc(config.settings.gc_threshold)
            # Installed before anything can be probed: a SIGTERM sent as soon as the health endpoint answers must
            # stop the daemon cleanly, not kill it with the default handler.
            signals = install_signal_handlers(daemon)
            try:
                # Before the daemon takes any task: a daemon that cannot serve its probes must not start working.
                http = await _start_http(daemon, config)
                starting = daemon
                await daemon.start()
            except asyncio.CancelledError:
                interrupted = asyncio.current_task()
                if not signals.interrupted_start or interrupted is None:
                    raise
                interrupted.uncancel()  # handled: the bounded waits of the hand-back below must work as usual
                return 0  # a signal during start-up: the finally clauses hand back what it took
            signals.started = True
            current = asyncio.current_task()
            if signals.interrupted_start and current is not None:
                # The cancel reached a NATS call that swallowed it, and start-up went on: stop now instead.
                current.uncancel()
                await daemon.shutdown()
            # The demo ends the daemon itself; a "Ctrl-C to stop" there would promise the wrong thing.
            until = "the demo follows, then it stops" if demo else "Ctrl-C to stop"
            loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]  # asyncio or uvloop
            _announce(config, f"rebaser daemon serving (app {config.app}, {loop} event loop); {until}")
            if demo:
                from rebaser_server.devtools.demo import run_demo

                demo_task = asyncio.create_task(run_demo(nc, config.settings, daemon))
                demo_task.add_done_callback(lambda _t: asyncio.ensure_future(daemon.shutdown()))
            await daemon.stopped.wait()
            if daemon.failure is not None:
                return 1
        finally:
            if starting is not None and not starting.stopped.is_set():
                await starting.shutdown()  # failed half-way: hand back whatever it took
            if http is not None:
                await http.stop()
            await close_connection(nc)  # also during an outage (SIGTERM while NATS is down)
    finally:
        if embedded is not None:
            embedded.stop()
    return 0


def tune_gc(threshold: int) -> None:
    """Freeze what start-up allocated and collect generation 0 every ``threshold`` allocations (0: leave Python's
    collector as it is).

    Every owned change set keeps a few hundred objects alive (its processor, nats-py's subscription and tasks), and
    with Python's threshold of 700 the collector runs thousands of times a second under load and re-walks all of
    them in its older generations: a third of a daemon's CPU in a burst of new change sets, and pauses of 0.3 s
    (``bench/bench.py --gc-stats``).
    The ~60,000 objects of start-up (modules, pydantic schemas) never die, so they are frozen out of every walk.
    """
    if threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)


def _announce(config: ServerConfig, line: str) -> None:
    """What the operator is told at start-up: plain lines on stdout, or log records when logs are JSON (so that
    everything a log pipeline gets from the daemon parses)."""
    if config.log_format == "json":
        log.info("%s", line)
    else:
        click.echo(line)


def _load_app(spec: str) -> RebaserApp:
    try:
        return load_app(spec)
    except (ImportError, AttributeError, ValueError, TypeError) as err:
        # load_app's ValueError already says how an app is given.
        raise click.ClickException(f"cannot load --app {spec}: {type(err).__name__}: {err}") from None


async def _connect(options: ConnectOptions) -> NatsClient:
    # nats-py reports every failed attempt of the first connect (twice a second until connect_timeout): an operator
    # who mistyped the URL gets the one error below instead. Once connected, its errors are logged as usual.
    connected = False

    async def error_cb(err: Exception) -> None:
        if connected:
            log.warning("nats: %s", err)

    if "error_cb" not in options.extra:
        options = dataclasses.replace(options, extra={**options.extra, "error_cb": error_cb})
    try:
        nc = await connect(options)
        connected = True
        return nc
    except (TimeoutError, OSError, nats.errors.Error) as err:
        servers = ", ".join(map(redact_url, options.servers))
        raise click.ClickException(
            f"cannot connect to NATS at {servers} ({'no answer' if isinstance(err, TimeoutError) else err}); "
            "is it running, and is --nats-url (REBASER_NATS_URL) right?"
        ) from None


def _start_embedded(config: ServerConfig) -> NatsServer:
    """The embedded server on ``config.data_dir``; a one-line error for what a user can fix."""
    store = config.data_dir / "nats"
    port = config.embedded_port
    # die_with_parent: a daemon killed with SIGKILL takes its server along instead of leaving it on the store.
    embedded = NatsServer(
        store_dir=store,
        port=port,
        host=config.embedded_host,
        expose=True,
        die_with_parent=True,
        sync=config.embedded_sync,
    )
    start_embedded(
        embedded.start,
        in_use=f"data directory {config.data_dir} is in use by another rebaser-server{{holder}}; "
        "stop it, or pass another --data-dir",
        port_taken=f"port {port} on {config.embedded_host} is taken (another nats-server or rebaser-server?); "
        "run the embedded server on another with --port N (0: any free port), or use --nats-url",
    )
    sync = describe_sync(embedded.sync)
    _announce(
        config,
        f"embedded nats-server listening on {embedded.url} (pid {embedded.pid}, store {store}, {sync}, "
        f"monitoring {embedded.monitoring_url})",
    )
    return embedded


async def _start_http(daemon: Daemon, config: ServerConfig) -> HealthServer | None:
    if config.http_port < 0:
        return None
    http = HealthServer(daemon, host=config.http_host, port=config.http_port, token=config.http_token)
    try:
        await http.start()
    except OSError as err:
        # Running on without probes would look dead (or like another daemon) to whatever probes this port.
        reason = "is taken" if err.errno == errno.EADDRINUSE else f"cannot be used ({err.strerror or err})"
        raise click.ClickException(
            f"health endpoint port {config.http_host}:{config.http_port} {reason}; "
            "choose another with --http-port N (0: any free port, -1: no health endpoint)"
        ) from None
    _announce(config, f"health endpoint on {http.url} (/healthz, /readyz, /status, /metrics; {http.access})")
    return http
