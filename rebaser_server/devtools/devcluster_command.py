"""``rebaser-server dev-cluster``, the command: its options, the app checked once (rather than as N daemons failing the
same way), and the run of a :class:`~rebaser_server.devtools.devcluster.DevCluster`: started, announced, and
stopped on SIGTERM or Ctrl-C (a second signal kills everything at once), with the demo load when asked for.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import click

from rebaser_core.errors import RebaserError
from rebaser_server.app import load_app
from rebaser_server.daemon.config import DEFAULT_APP
from rebaser_server.devtools.devcluster import DAEMON_CREDENTIALS, DevCluster
from rebaser_server.devtools.embedded_start import sync_option

__all__ = ["command"]


async def _serve(cluster: DevCluster, demo: bool) -> int:
    serving = asyncio.current_task()
    assert serving is not None
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            click.echo("second signal: killing everything now", err=True)
            cluster.kill_now()
            os._exit(1)
        click.echo(f"{signal.Signals(signum).name}: stopping (again to kill everything at once)", err=True)
        serving.cancel()

    loop = asyncio.get_running_loop()
    load: asyncio.Task[None] | None = None
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        cluster.start_nats()  # blocking, on purpose: on this (the main) thread, see DevCluster
        await cluster.start_daemons()
        cluster.announce()
        if demo:
            load = asyncio.create_task(_demo_load(cluster.load_urls))
        await asyncio.Event().wait()  # until a signal
    except asyncio.CancelledError:
        if not signals:
            raise
        serving.uncancel()  # handled: the bounded waits of stop() must work as usual
    finally:
        if load is not None:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
        await cluster.stop()
    return 0


async def _demo_load(urls: list[str]) -> None:
    from rebaser_server.devtools.devload import run_load  # only when asked for

    try:
        # The daemons' prefix: they inherit REBASER_PREFIX from this environment too.
        await run_load(urls, click.echo, prefix=os.environ.get("REBASER_PREFIX") or None)
    except RebaserError as err:  # the cluster goes on without its demo
        click.echo(f"demo load stopped: {type(err).__name__}: {err}", err=True)


@click.command(context_settings={"show_default": True, "max_content_width": 110})
@click.option("--daemons", type=click.IntRange(1, 32), default=3, help="How many daemons.")
@click.option(
    "--demo", is_flag=True, help="Also send a steady demo load and print a line about it every 5 s."
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    show_default="a temporary directory, removed at exit",
    help="Where the NATS stores, the daemons' logs and status.json are kept (and found again next time).",
)
@click.option(
    "--nats-port",
    type=click.IntRange(0, 65533),
    default=0,
    help="Client port of the first NATS node (the others: the next ones); 0: any free ports.",
)
@click.option(
    "--http-port",
    type=click.IntRange(0, 65535 - 32),
    default=0,
    help="Health endpoint of the first daemon (the others: the next ones); 0: any free ports.",
)
@click.option("--app", "app_spec", default=DEFAULT_APP, help="The daemons' application, as module:attr.")
@click.option(
    "--sync",
    default="always",
    callback=sync_option,
    help="When the NATS nodes fsync: always (before acknowledging), a duration such as 1s, or interval (2m).",
)
@click.option(
    "--accounts",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="A NATS accounts configuration for every node, e.g. docs/nats-accounts.conf: callers in accounts of "
    "their own (docs/accounts.md). The daemons connect as --daemon-user.",
)
@click.option("--daemon-user", default=DAEMON_CREDENTIALS[0], help="With --accounts: the daemons' NATS user.")
@click.option(
    "--daemon-password",
    envvar="REBASER_DEV_DAEMON_PASSWORD",
    show_envvar=True,
    default=DAEMON_CREDENTIALS[1],
    help="With --accounts: the daemons' NATS password.",
)
@click.option(
    "--stop-timeout",
    type=click.FloatRange(1),
    default=30.0,
    help="Seconds the daemons get to stop after SIGTERM before they are killed.",
)
def command(
    daemons: int,
    demo: bool,
    data_dir: Path | None,
    nats_port: int,
    http_port: int,
    app_spec: str,
    sync: str | None,
    accounts: Path | None,
    daemon_user: str,
    daemon_password: str,
    stop_timeout: float,
) -> None:
    """Run docker-compose.yml's topology as local processes: 3 NATS nodes and N daemons on 127.0.0.1.

    Every daemon option can be set as its REBASER_* variable, which the daemons inherit (rebaser-server --help).
    """
    try:
        load_app(app_spec)  # here, once, rather than as N daemons failing the same way
    except (ImportError, AttributeError, ValueError, TypeError) as err:
        raise click.ClickException(f"cannot load --app {app_spec}: {type(err).__name__}: {err}") from None
    cluster = DevCluster(
        daemons=daemons,
        app=app_spec,
        data_dir=data_dir,
        nats_port=nats_port,
        http_port=http_port,
        stop_timeout=stop_timeout,
        sync=sync,
        accounts=accounts,
        daemon_credentials=(daemon_user, daemon_password),
    )
    raise SystemExit(asyncio.run(_serve(cluster, demo)))
