"""``rebaser-server``: the daemon.

With no ``--nats-url`` it starts an embedded nats-server (persistent store under ``--data-dir``), prints its URL,
and serves. ``--demo`` also sends demo traffic and prints what happens, then exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import gc
import logging
from pathlib import Path

import click
import nats.errors
from nats.aio.client import Client as NatsClient

from rebaser_core.connect import ConnectOptions, close_connection, connect, redact_url
from rebaser_core.embedded import NatsServer
from rebaser_core.errors import LayoutMismatch
from rebaser_server.app import RebaserApp, load_app
from rebaser_server.cli.config_file import FILE_SETTINGS, load_config_file, settings_from, tunable
from rebaser_server.cli.signals import install_signal_handlers
from rebaser_server.daemon.config import (
    DEFAULT_APP,
    DEFAULT_EMBEDDED_HOST,
    DEFAULT_EMBEDDED_PORT,
    ServerConfig,
)
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.devtools.devcluster import command as dev_cluster
from rebaser_server.devtools.embedded_start import start_embedded
from rebaser_server.ops.http import DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT, HealthServer
from rebaser_server.ops.logs import LOG_FORMATS, LogFormat, configure_logging
from rebaser_server.ops.tracing import TracingError, configure_tracing

log = logging.getLogger("rebaser_server")


async def serve(config: ServerConfig, *, demo: bool = False) -> int:
    app = _load_app(config.app)  # before anything is started: a typo in --app is the commonest mistake
    embedded: NatsServer | None = None
    options = config.connect
    if options is None:
        embedded = _start_embedded(config)
        options = ConnectOptions(servers=(embedded.url,), name="rebaser-server")
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
            _announce(config, f"rebaser daemon serving (app {config.app}); {until}")
            if demo:
                from rebaser_server.devtools.demo import run_demo

                demo_task = asyncio.create_task(run_demo(nc, config.settings, daemon))
                demo_task.add_done_callback(lambda _t: asyncio.ensure_future(daemon.shutdown()))
            await daemon.stopped.wait()
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
    with Python's threshold of 700 the collector ran thousands of times a second under load and re-walked all of
    them in its older generations: a third of a daemon's CPU in a burst of new change sets, and pauses of 0.3 s.
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
        raise click.ClickException(
            f"cannot load --app {spec}: {type(err).__name__}: {err} (give it as module:attribute)"
        ) from None


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
        store_dir=store, port=port, host=config.embedded_host, expose=True, die_with_parent=True
    )
    start_embedded(
        embedded.start,
        in_use=f"data directory {config.data_dir} is in use by another rebaser-server{{holder}}; "
        "stop it, or pass another --data-dir",
        port_taken=f"port {port} on {config.embedded_host} is taken (another nats-server or rebaser-server?); "
        "run the embedded server on another with --port N (0: any free port), or use --nats-url",
    )
    _announce(config, f"embedded nats-server listening on {embedded.url} (pid {embedded.pid}, store {store})")
    return embedded


async def _start_http(daemon: Daemon, config: ServerConfig) -> HealthServer | None:
    if config.http_port < 0:
        return None
    http = HealthServer(daemon, host=config.http_host, port=config.http_port)
    try:
        await http.start()
    except OSError as err:
        # Running on without probes would look dead (or like another daemon) to whatever probes this port.
        reason = "is taken" if err.errno == errno.EADDRINUSE else f"cannot be used ({err.strerror or err})"
        raise click.ClickException(
            f"health endpoint port {config.http_host}:{config.http_port} {reason}; "
            "choose another with --http-port N (0: any free port, -1: no health endpoint)"
        ) from None
    _announce(config, f"health endpoint on {http.url} (/healthz, /readyz, /status, /metrics)")
    return http


@click.group(invoke_without_command=True, context_settings={"show_default": True, "max_content_width": 110})
@click.version_option(package_name="rebaser", prog_name="rebaser-server")
@click.option(
    "--config",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="REBASER_CONFIG",
    show_envvar=True,
    is_eager=True,
    expose_value=False,
    callback=load_config_file,
    help="TOML file of option values (e.g. http-port = 9464) and settings (e.g. ready_max_backlog = 100); "
    "flags and REBASER_* variables override it.",
)
@click.option(
    "--nats-url",
    "nats_urls",
    multiple=True,
    envvar="REBASER_NATS_URL",
    show_envvar=True,
    help="NATS server URL (repeatable; in the variable, separated by spaces). None: run an embedded server.",
)
@click.option("--user", envvar="REBASER_NATS_USER", show_envvar=True, help="NATS user name.")
@click.option("--password", envvar="REBASER_NATS_PASSWORD", show_envvar=True, help="NATS password.")
@click.option("--token", envvar="REBASER_NATS_TOKEN", show_envvar=True, help="NATS authentication token.")
@click.option(
    "--nkey-seed", envvar="REBASER_NATS_NKEY_SEED", show_envvar=True, help="Path to an nkey seed file."
)
@click.option("--creds", envvar="REBASER_NATS_CREDS", show_envvar=True, help="Path to a NATS .creds file.")
@click.option(
    "--tls-ca", envvar="REBASER_NATS_TLS_CA", show_envvar=True, help="CA certificate (PEM) for NATS TLS."
)
@click.option(
    "--tls-cert",
    envvar="REBASER_NATS_TLS_CERT",
    show_envvar=True,
    help="Client certificate (PEM) for NATS TLS.",
)
@click.option(
    "--tls-key", envvar="REBASER_NATS_TLS_KEY", show_envvar=True, help="Client key (PEM) for NATS TLS."
)
@click.option(
    "--prefix",
    default=None,
    envvar="REBASER_PREFIX",
    show_envvar=True,
    help="Subject/stream prefix of this deployment (none: the plain names).",
)
@click.option(
    "--app",
    "app_spec",
    default=DEFAULT_APP,
    envvar="REBASER_APP",
    show_envvar=True,
    help="Application as module:attr.",
)
@click.option(
    "--streams",
    type=click.IntRange(1, 64),
    default=None,
    envvar="REBASER_STREAMS",
    show_envvar=True,
    help="Shards of requests and tasks. The cluster's layout is authoritative: this creates it (first daemon; "
    "default 1) or must agree with it. Change it with `rebaser streams set N`.",
)
@click.option(
    "--assignment",
    type=click.Choice(["shared", "pinned"]),
    default=None,
    envvar="REBASER_ASSIGNMENT",
    show_envvar=True,
    help="shared: every daemon pulls every shard; pinned: daemon i of --daemons R serves shards i, i+R, ... "
    "(default: the layout's, else shared).",
)
@click.option(
    "--daemons",
    type=click.IntRange(1),
    default=None,
    envvar="REBASER_DAEMONS",
    show_envvar=True,
    help="Pinned mode: how many daemons share the shards (at most --streams).",
)
@click.option(
    "--replica-index",
    type=click.IntRange(0),
    default=None,
    envvar="REBASER_REPLICA_INDEX",
    show_envvar=True,
    help="Pinned mode: this daemon's index 0..R-1 (default: the hostname's ordinal, rebaser-2 is 2).",
)
@tunable("concurrency", int, "Change sets this daemon owns at once.")
@tunable("quiescent_period", float, "Seconds of quiet before a change set is released.")
@tunable("ack_wait", float, "Seconds after which a silent owner loses its task (a dead daemon's stall).")
@tunable("progress_period", float, "Seconds between lease renewals (at most 0.25 x ack-wait).")
@tunable("handler_deadline", float, "Seconds one apply or DVU step may run before it counts as wedged.")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    envvar="REBASER_DATA_DIR",
    show_envvar=True,
    show_default="~/.local/share/rebaser",
    help="Store of the embedded server.",
)
@click.option(
    "--port",
    "embedded_port",
    type=int,
    default=DEFAULT_EMBEDDED_PORT,
    envvar="REBASER_EMBEDDED_PORT",
    show_envvar=True,
    help="Client port of the embedded server (0 picks a free one).",
)
@click.option(
    "--host",
    "embedded_host",
    default=DEFAULT_EMBEDDED_HOST,
    envvar="REBASER_EMBEDDED_HOST",
    show_envvar=True,
    help="Address the embedded server listens on (0.0.0.0 in a container, to be reachable from outside it).",
)
@click.option(
    "--http-host",
    default=DEFAULT_HTTP_HOST,
    envvar="REBASER_HTTP_HOST",
    show_envvar=True,
    help="Address of the health endpoint (/healthz, /readyz, /status, /metrics).",
)
@click.option(
    "--http-port",
    type=int,
    default=DEFAULT_HTTP_PORT,
    envvar="REBASER_HTTP_PORT",
    show_envvar=True,
    help="Port of the health endpoint; 0 picks a free one, -1 turns it off.",
)
@click.option(
    "--demo",
    is_flag=True,
    envvar="REBASER_DEMO",
    show_envvar=True,
    help="Send demo traffic, print what happens, then exit.",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),  # any case
    default="INFO",
    envvar="REBASER_LOG_LEVEL",
    show_envvar=True,
    help="Lowest level logged.",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="console",
    envvar="REBASER_LOG_FORMAT",
    show_envvar=True,
    help="console: lines for people; json: one JSON object a line, request ids as fields.",
)
@click.pass_context
def main(
    ctx: click.Context,
    nats_urls: tuple[str, ...],
    user: str | None,
    password: str | None,
    token: str | None,
    nkey_seed: str | None,
    creds: str | None,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    prefix: str | None,
    app_spec: str,
    streams: int | None,
    assignment: str | None,
    daemons: int | None,
    replica_index: int | None,
    concurrency: int,
    quiescent_period: float,
    ack_wait: float,
    progress_period: float,
    handler_deadline: float,
    data_dir: Path | None,
    embedded_port: int,
    embedded_host: str,
    http_host: str,
    http_port: int,
    demo: bool,
    log_level: str,
    log_format: LogFormat,
) -> None:
    """Run a rebaser daemon.

    Every option can also be given as the REBASER_* variable shown, or in the --config file; every other tunable
    (rebaser_core/settings.py) as REBASER_<FIELD> or in the --config file. Tracing is off unless the standard
    OTEL_TRACES_EXPORTER variable asks for it (console, or otlp with the rebaser[otlp] extra; OTEL_SERVICE_NAME,
    OTEL_EXPORTER_OTLP_ENDPOINT, ...).

    ``rebaser-server dev-cluster`` runs a local cluster instead (see its --help).
    """
    if ctx.invoked_subcommand is not None:
        return  # a subcommand (dev-cluster) takes its own options
    configure_logging(log_level, log_format)
    try:
        tracing = configure_tracing()
    except TracingError as err:
        raise click.ClickException(str(err)) from None
    settings = settings_from(
        ctx.meta.get(FILE_SETTINGS, {}),
        prefix=prefix,
        streams=streams,
        assignment=assignment,
        daemons=daemons,
        replica_index=replica_index,
        concurrency=concurrency,
        quiescent_period=quiescent_period,
        ack_wait=ack_wait,
        progress_period=progress_period,
        handler_deadline=handler_deadline,
    )
    connect_options = None
    if nats_urls:
        connect_options = ConnectOptions(
            servers=tuple(nats_urls),
            name="rebaser-server",
            user=user,
            password=password,
            token=token,
            nkeys_seed=nkey_seed,
            creds=creds,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
    config = ServerConfig(
        settings=settings,
        connect=connect_options,
        app=app_spec,
        embedded_port=embedded_port,
        embedded_host=embedded_host,
        http_host=http_host,
        http_port=http_port,
        log_format=log_format,
        **({"data_dir": data_dir} if data_dir else {}),
    )
    try:
        code = asyncio.run(serve(config, demo=demo))
    except (
        LayoutMismatch
    ) as err:  # a flag that disagrees with the cluster's shard layout: one line, no traceback
        raise click.ClickException(f"LayoutMismatch: {err}") from None
    finally:
        if tracing is not None:
            tracing.shutdown()  # exports the spans still batched
    raise SystemExit(code)


main.add_command(dev_cluster, "dev-cluster")
