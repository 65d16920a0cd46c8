"""``rebaser console``: serve the web console (:mod:`rebaser_client.admin.console`) until Ctrl-C or SIGTERM.

It binds 127.0.0.1 by default; any other address needs ``--token`` (or ``REBASER_CONSOLE_TOKEN``), which every
request must then carry. ``--tls-cert`` and ``--tls-key`` serve it over HTTPS (its cookie is then ``Secure``).
aiohttp and nats-py are imported once the options are checked.
"""

from __future__ import annotations

import contextlib
import signal
import ssl
import sys

import click

from rebaser_client.admin.cli.common import connection_options, subjects_of
from rebaser_core.errors import RebaserError

__all__ = ["console", "serving_line", "tls_context"]

LOOPBACK = ("127.0.0.1", "::1", "localhost")
ANY = ("0.0.0.0", "::", "")


def serving_line(host: str, port: int, scheme: str = "http") -> str:
    """Where to open the console: a URL a person can open. Bound to every interface (0.0.0.0, ::), that is
    127.0.0.1 on this machine, and this machine's name from elsewhere; it says it listens on all of them."""
    if host in ANY:
        import socket

        loopback = "[::1]" if host == "::" else "127.0.0.1"
        return (
            f"{scheme}://{loopback}:{port}/ (listening on all interfaces, {host or '0.0.0.0'}: from elsewhere "
            f"{scheme}://{socket.gethostname()}:{port}/)"
        )
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}/"


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The server's TLS context of ``--tls-cert`` and ``--tls-key`` (both or neither), or a one-line error."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise click.UsageError("--tls-cert and --tls-key go together: give both, or neither for plain HTTP")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise click.BadParameter(
            f"cannot load the certificate {cert} with the key {key}: {err}", param_hint="--tls-cert/--tls-key"
        ) from None
    return context


@click.command()
@connection_options
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to bind (not loopback: needs --token)."
)
@click.option(
    "--port", default=8470, show_default=True, type=click.IntRange(0, 65535), help="0: any free port."
)
@click.option(
    "--token",
    envvar="REBASER_CONSOLE_TOKEN",
    default=None,
    help="A secret every request must carry (open the console once with ?token=...). Needed off loopback.",
)
@click.option("--read-only", is_flag=True, help="Show everything, change nothing: every action is refused.")
@click.option(
    "--daemon-url",
    "daemon_urls",
    multiple=True,
    help="A daemon's health endpoint (http://HOST:9464), once per daemon: the overview shows its health.",
)
@click.option(
    "--tls-cert",
    envvar="REBASER_CONSOLE_TLS_CERT",
    type=click.Path(dir_okay=False),
    default=None,
    help="Serve HTTPS with this certificate (PEM, its chain after it); needs --tls-key.",
)
@click.option(
    "--tls-key",
    envvar="REBASER_CONSOLE_TLS_KEY",
    type=click.Path(dir_okay=False),
    default=None,
    help="The certificate's private key (PEM, not encrypted).",
)
@click.option(
    "--refresh",
    type=click.FloatRange(0.1, 60),
    default=1.0,
    show_default=True,
    help="Seconds between two reads of the streams' counts.",
)
def console(
    nats_url: str,
    prefix: str | None,
    host: str,
    port: int,
    token: str | None,
    read_only: bool,
    daemon_urls: tuple[str, ...],
    tls_cert: str | None,
    tls_key: str | None,
    refresh: float,
) -> None:
    """Serve the web console: the overview, the change sets (live, filtered), one change set's timeline, the dead
    letters, and pause, resume, skip, replay and drop, each asked first."""
    if host not in LOOPBACK and not token:
        raise click.UsageError(
            f"--host {host} is not a loopback address: give --token (or REBASER_CONSOLE_TOKEN) so that only those who "
            "have it can use the console"
        )
    if token is not None and len(token) < 16:
        raise click.BadParameter("at least 16 characters", param_hint="--token")
    tls = tls_context(tls_cert, tls_key)
    subjects = subjects_of(prefix)
    import asyncio
    import logging

    # The audit log (every action, every refused request: rebaser_client.admin.console.guard.audit), one JSON
    # line each, on stderr.
    audit_log = logging.getLogger("rebaser.console.audit")
    if not audit_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        audit_log.addHandler(handler)
        audit_log.setLevel(logging.INFO)
        audit_log.propagate = False

    from aiohttp import web

    from rebaser_client.admin.console.live import Live
    from rebaser_client.admin.console.server import make_app, serving_port, set_port
    from rebaser_core.nats.connect import ConnectOptions, close_connection, connect

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)
        # A console runs for days: it reconnects to NATS for as long as it runs (unlike a one-shot command).
        nc = await connect(ConnectOptions(servers=(nats_url,), extra={"max_reconnect_attempts": -1}))
        live = Live(nc, subjects, daemon_urls=daemon_urls, refresh=refresh)
        app = make_app(live, token=token, read_only=read_only, port=port)
        # A browser that goes away ends its event stream's handler at once (not at its next write).
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        try:
            await live.start()
            await runner.setup()
            site = web.TCPSite(runner, host, port, ssl_context=tls)
            await site.start()
            bound = serving_port(site, port)
            set_port(app, bound)  # --port 0: the port the system gave (a request's Host must name it)
            mode = ", read-only" if read_only else ""
            scheme = "https" if tls is not None else "http"
            click.echo(f"rebaser console serving {serving_line(host, bound, scheme)}{mode}")
            sys.stdout.flush()
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
            await live.stop()
            await close_connection(nc)

    try:
        with contextlib.suppress(asyncio.CancelledError, KeyboardInterrupt):
            asyncio.run(main())
    except RebaserError as err:
        raise click.ClickException(f"{type(err).__name__}: {err}") from None
    except OSError as err:
        raise click.ClickException(f"cannot serve on {host}:{port}: {err}") from None
