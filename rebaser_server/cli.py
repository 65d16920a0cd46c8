"""``rebaser-server``: the daemon.

With no ``--nats-url`` it starts an embedded nats-server (persistent store under ``--data-dir``), prints its URL,
and serves. ``--demo`` also sends demo traffic and prints what happens, then exits.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
from pathlib import Path

import click

from rebaser_core.connect import ConnectOptions, close_connection, connect
from rebaser_core.embedded import NatsServer
from rebaser_core.embedded.net import ADDR_IN_USE
from rebaser_core.errors import EmbeddedServerError, StoreInUse
from rebaser_core.settings import Settings
from rebaser_server.app import load_app
from rebaser_server.config import DEFAULT_APP, DEFAULT_EMBEDDED_PORT, ServerConfig
from rebaser_server.http import DEFAULT_HTTP_HOST, DEFAULT_HTTP_PORT, HealthServer
from rebaser_server.server import Daemon

log = logging.getLogger("rebaser_server")


async def serve(config: ServerConfig, *, demo: bool = False) -> int:
    embedded: NatsServer | None = None
    options = config.connect
    if options is None:
        embedded = _start_embedded(config)
        options = ConnectOptions(servers=(embedded.url,), name="rebaser-server")
    # Shutdown runs in this order, also when starting fails half-way: the daemon hands its change sets back (each
    # hand-back confirmed by the server, see rebaser_server.handback), the connection is drained (which flushes
    # the last replies), and only then is the embedded server stopped, gracefully, so that it stores all of it.
    try:
        nc = await connect(options)
        http: HealthServer | None = None
        starting: Daemon | None = None  # set once it may have taken tasks
        try:
            daemon = Daemon(nc, config.settings, load_app(config.app))
            # Before the daemon takes any task: a daemon that cannot serve its probes must not start working.
            http = await _start_http(daemon, config)
            starting = daemon
            await daemon.start()
            _install_signal_handlers(daemon)
            # The demo ends the daemon itself; a "Ctrl-C to stop" there would promise the wrong thing.
            until = "the demo follows, then it stops" if demo else "Ctrl-C to stop"
            click.echo(f"rebaser daemon serving (app {config.app}); {until}")
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


def _start_embedded(config: ServerConfig) -> NatsServer:
    """The embedded server on ``config.data_dir``; a one-line error for what a user can fix."""
    store = config.data_dir / "nats"
    port = config.embedded_port
    # die_with_parent: a daemon killed with SIGKILL takes its server along instead of leaving it on the store.
    embedded = NatsServer(store_dir=store, port=port, die_with_parent=True)
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
            f"port {port} on 127.0.0.1 is taken (another nats-server or rebaser-server?); "
            "run the embedded server on another with --port N (0: any free port), or use --nats-url"
        ) from None
    click.echo(f"embedded nats-server listening on {embedded.url} (pid {embedded.pid}, store {store})")
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
    click.echo(f"health endpoint on {http.url} (/healthz, /readyz, /status)")
    return http


def _install_signal_handlers(daemon: Daemon) -> None:
    loop = asyncio.get_running_loop()
    signals_seen = 0
    shutdowns: list[asyncio.Future[None]] = []  # keep a reference so the task is not garbage-collected

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            log.warning("second signal: exiting at once")
            os._exit(1)
        log.info("signal %s: shutting down (again to exit at once)", signal.Signals(signum).name)
        shutdowns.append(asyncio.ensure_future(daemon.shutdown()))

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)


@click.command()
@click.option(
    "--nats-url",
    "nats_urls",
    multiple=True,
    envvar="REBASER_NATS_URL",
    help="NATS server URL (repeatable). None: run an embedded server.",
)
@click.option("--user", envvar="REBASER_NATS_USER")
@click.option("--password", envvar="REBASER_NATS_PASSWORD")
@click.option("--token", envvar="REBASER_NATS_TOKEN")
@click.option("--nkey-seed", envvar="REBASER_NATS_NKEY_SEED", help="Path to an nkey seed file.")
@click.option("--creds", envvar="REBASER_NATS_CREDS", help="Path to a NATS .creds file.")
@click.option("--tls-ca", envvar="REBASER_NATS_TLS_CA")
@click.option("--tls-cert", envvar="REBASER_NATS_TLS_CERT")
@click.option("--tls-key", envvar="REBASER_NATS_TLS_KEY")
@click.option("--prefix", default=None, help="Subject/stream prefix of this deployment.")
@click.option("--app", "app_spec", default=DEFAULT_APP, show_default=True, help="Application as module:attr.")
@click.option("--concurrency", type=int, default=None, help="Change sets this daemon owns at once.")
@click.option("--quiescent-period", type=float, default=None, help="Seconds of quiet before release.")
@click.option("--ack-wait", type=float, default=None)
@click.option("--progress-period", type=float, default=None)
@click.option("--handler-deadline", type=float, default=None)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Store of the embedded server (default ~/.local/share/rebaser).",
)
@click.option(
    "--port",
    "embedded_port",
    type=int,
    default=DEFAULT_EMBEDDED_PORT,
    show_default=True,
    envvar="REBASER_EMBEDDED_PORT",
    help="Client port of the embedded server on 127.0.0.1 (0 picks a free one).",
)
@click.option(
    "--http-host",
    default=DEFAULT_HTTP_HOST,
    show_default=True,
    envvar="REBASER_HTTP_HOST",
    help="Address of the health endpoint (/healthz, /readyz, /status).",
)
@click.option(
    "--http-port",
    type=int,
    default=DEFAULT_HTTP_PORT,
    show_default=True,
    envvar="REBASER_HTTP_PORT",
    help="Port of the health endpoint; 0 picks a free one, -1 turns it off.",
)
@click.option("--demo", is_flag=True, help="Send demo traffic, print what happens, then exit.")
@click.option("--log-level", default="INFO", show_default=True)
def main(
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
    concurrency: int | None,
    quiescent_period: float | None,
    ack_wait: float | None,
    progress_period: float | None,
    handler_deadline: float | None,
    data_dir: Path | None,
    embedded_port: int,
    http_host: str,
    http_port: int,
    demo: bool,
    log_level: str,
) -> None:
    """Run a rebaser daemon."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env(
        prefix=prefix,
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
        http_host=http_host,
        http_port=http_port,
        **({"data_dir": data_dir} if data_dir else {}),
    )
    raise SystemExit(asyncio.run(serve(config, demo=demo)))
