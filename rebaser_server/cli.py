"""``rebaser-server``: the daemon.

With no ``--nats-url`` it starts an embedded nats-server (persistent store under ``--data-dir``), prints its URL,
and serves. ``--demo`` also sends demo traffic and prints what happens, then exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import io
import logging
import os
import signal
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import nats.errors
from nats.aio.client import Client as NatsClient
from pydantic import ValidationError

from rebaser_core.connect import ConnectOptions, close_connection, connect, redact_url
from rebaser_core.embedded import NatsServer
from rebaser_core.embedded.net import ADDR_IN_USE
from rebaser_core.errors import EmbeddedServerError, LayoutMismatch, StoreInUse
from rebaser_core.settings import Settings
from rebaser_server.app import RebaserApp, load_app
from rebaser_server.config import DEFAULT_APP, DEFAULT_EMBEDDED_HOST, DEFAULT_EMBEDDED_PORT, ServerConfig
from rebaser_server.http import DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT, HealthServer
from rebaser_server.logs import LOG_FORMATS, LogFormat, configure_logging
from rebaser_server.server import Daemon
from rebaser_server.tracing import TracingError, configure_tracing

log = logging.getLogger("rebaser_server")


async def serve(config: ServerConfig, *, demo: bool = False) -> int:
    app = _load_app(config.app)  # before anything is started: a typo in --app is the commonest mistake
    embedded: NatsServer | None = None
    options = config.connect
    if options is None:
        embedded = _start_embedded(config)
        options = ConnectOptions(servers=(embedded.url,), name="rebaser-server")
    # Shutdown runs in this order, also when starting fails half-way: the daemon hands its change sets back (each
    # hand-back confirmed by the server, see rebaser_server.handback), the connection is drained (which flushes
    # the last replies), and only then is the embedded server stopped, gracefully, so that it stores all of it.
    try:
        nc = await _connect(options)
        http: HealthServer | None = None
        starting: Daemon | None = None  # set once it may have taken tasks
        try:
            daemon = Daemon(nc, config.settings, app)
            # Installed before anything can be probed: a SIGTERM sent as soon as the health endpoint answers must
            # stop the daemon cleanly, not kill it with the default handler.
            signals = _install_signal_handlers(daemon)
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
                from rebaser_server.demo import run_demo

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
    try:
        embedded.start()
    except StoreInUse as err:
        holder = f" (pid {err.holder_pid})" if err.holder_pid else ""
        raise click.ClickException(
            f"data directory {config.data_dir} is in use by another rebaser-server{holder}; "
            "stop it, or pass another --data-dir"
        ) from None
    except EmbeddedServerError as err:
        if ADDR_IN_USE not in str(err):
            raise
        raise click.ClickException(
            f"port {port} on {config.embedded_host} is taken (another nats-server or rebaser-server?); "
            "run the embedded server on another with --port N (0: any free port), or use --nats-url"
        ) from None
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


class _Signals:
    def __init__(self) -> None:
        self.started = False  # the daemon has started: a signal shuts it down
        self.interrupted_start = False  # a signal came while it was starting: start-up was cancelled


def _install_signal_handlers(daemon: Daemon) -> _Signals:
    loop = asyncio.get_running_loop()
    serving = asyncio.current_task()
    state = _Signals()
    signals_seen = 0
    shutdowns: list[asyncio.Future[None]] = []  # keep a reference so the task is not garbage-collected

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            log.warning("second signal: exiting at once")
            os._exit(1)
        log.info("signal %s: shutting down (again to exit at once)", signal.Signals(signum).name)
        if state.started or serving is None:
            shutdowns.append(asyncio.ensure_future(daemon.shutdown()))
        else:
            # Starting may wait for JetStream for a long time (set-up is retried): interrupt it instead.
            state.interrupted_start = True
            serving.cancel()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    # A daemon that seems stuck explains itself without being stopped: `kill -USR1 PID` logs where every
    # coroutine is waiting.
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    return state


def dump_tasks() -> None:
    """Log every asyncio task of the running loop with its stack (SIGUSR1)."""
    out = io.StringIO()
    tasks = asyncio.all_tasks()
    for task in sorted(tasks, key=lambda t: t.get_name()):
        print(f"---- {task.get_name()}", file=out)
        task.print_stack(limit=20, file=out)
    log.warning("SIGUSR1: %d asyncio tasks\n%s", len(tasks), out.getvalue())


def _load_config_file(ctx: click.Context, _param: click.Parameter, path: Path | None) -> Path | None:
    """``--config FILE``: a TOML file of option values (long names, ``-`` or ``_``) and ``Settings`` fields.

    Its values are defaults: a flag on the command line or a ``REBASER_*`` variable still wins over them."""
    if path is None:
        return None
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as err:
        raise click.BadParameter(
            f"cannot read {path}: {err.strerror or err}", ctx=ctx, param=_param
        ) from None
    except tomllib.TOMLDecodeError as err:
        raise click.BadParameter(f"{path} is not valid TOML: {err}", ctx=ctx, param=_param) from None
    options = {p.name: p for p in ctx.command.params if p.name and p.name != "config"}
    by_flag = {
        opt.lstrip("-").replace("-", "_"): p.name
        for p in ctx.command.params
        if p.name
        for opt in getattr(p, "opts", ())
        if opt.startswith("--")
    }
    defaults: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name in by_flag and by_flag[name] in options:
            defaults[by_flag[name]] = value
        elif name in Settings.model_fields:
            settings[name] = value
        else:
            raise click.BadParameter(f"unknown key {key!r} in {path}", ctx=ctx, param=_param)
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    ctx.meta[_FILE_SETTINGS] = settings
    return path


def _settings(file_settings: dict[str, Any], **flags: object) -> Settings:
    """Settings from the config file, then ``REBASER_*`` variables, then flags; a bad value is one line."""
    values = dict(file_settings)
    values.update(
        {
            name: raw
            for name in Settings.model_fields
            if (raw := os.environ.get(f"REBASER_{name.upper()}")) is not None
        }
    )
    values.update({k: v for k, v in flags.items() if v is not None})
    try:
        return Settings.model_validate(values)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            where = ".".join(map(str, e["loc"]))
            message = e["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {message} (got {e['input']!r})" if e["loc"] else message)
        raise click.ClickException("bad setting: " + "; ".join(problems)) from None


_FILE_SETTINGS = "rebaser.file_settings"
_F = TypeVar("_F", bound=Callable[..., Any])
_TUNABLE = Settings.model_fields


def _tunable(name: str, type_: type[Any], help_text: str) -> Callable[[_F], _F]:
    """A flag for a ``Settings`` field: its default and its ``REBASER_*`` variable shown in ``--help``."""
    return click.option(
        f"--{name.replace('_', '-')}",
        name,
        type=type_,
        default=_TUNABLE[name].default,
        envvar=f"REBASER_{name.upper()}",
        show_envvar=True,
        help=help_text,
    )


@click.command(context_settings={"show_default": True, "max_content_width": 110})
@click.version_option(package_name="rebaser", prog_name="rebaser-server")
@click.option(
    "--config",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="REBASER_CONFIG",
    show_envvar=True,
    is_eager=True,
    expose_value=False,
    callback=_load_config_file,
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
@_tunable("concurrency", int, "Change sets this daemon owns at once.")
@_tunable("quiescent_period", float, "Seconds of quiet before a change set is released.")
@_tunable("ack_wait", float, "Seconds after which a silent owner loses its task (a dead daemon's stall).")
@_tunable("progress_period", float, "Seconds between lease renewals (at most 0.4 x ack-wait).")
@_tunable("handler_deadline", float, "Seconds one apply or DVU step may run before it counts as wedged.")
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
    """
    configure_logging(log_level, log_format)
    try:
        tracing = configure_tracing()
    except TracingError as err:
        raise click.ClickException(str(err)) from None
    settings = _settings(
        ctx.meta.get(_FILE_SETTINGS, {}),
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
