"""``rebaser-server``: the daemon.

With no ``--nats-url`` it starts an embedded nats-server (persistent store under ``--data-dir``), prints its URL,
and serves. ``--demo`` also sends demo traffic and prints what happens, then exits.

``--help`` and ``--version`` answer at once: the daemon, nats-py, aiohttp, OpenTelemetry and the ``dev-cluster``
subcommand are imported when they are used (``scripts/cli_timings.py`` measures it).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rebaser_server.cli.config_file import (
    CONFIG_PATH,
    FILE_SETTINGS,
    load_config_file,
    settings_from,
    tunable,
)
from rebaser_server.cli.environment import known_variables, unknown_variables
from rebaser_server.cli.option_groups import (
    embedded_server_options,
    health_endpoint_options,
    http_token_from,
    nats_connection_options,
)
from rebaser_server.daemon.config import DEFAULT_APP, ServerConfig
from rebaser_server.ops.logs import LOG_FORMATS, LogFormat, configure_logging

if TYPE_CHECKING:
    from rebaser_server.cli.serve import tune_gc

__all__ = ["main", "serve", "tune_gc"]

log = logging.getLogger(__name__)

# What ``rebaser-server --help`` lists for ``dev-cluster`` without importing it (the first sentence of its help;
# tests/unit/cli/test_server_command_line.py checks it still is).
DEV_CLUSTER_SUMMARY = (
    "Run docker-compose.yml's topology as local processes: 3 NATS nodes and N daemons on 127.0.0.1."
)
NEW_APP_SUMMARY = "Write a working app and its tests into a new directory, from the apps guide's example."


def run_on_loop(main: Coroutine[Any, Any, int], event_loop: str) -> int:
    """``asyncio.run(main)`` on the event loop the settings name (uvloop: imported only then)."""
    import asyncio

    if event_loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            main.close()
            raise click.ClickException(
                "event_loop is uvloop but uvloop is not installed (pip install 'rebaser[uvloop]')"
            ) from None
        return int(uvloop.run(main))
    return asyncio.run(main)


def __getattr__(name: str) -> Any:
    # tune_gc lives in rebaser_server.cli.serve (the daemon's imports): loaded when first asked for here.
    if name == "tune_gc":
        return importlib.import_module("rebaser_server.cli.serve").tune_gc
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


async def serve(config: ServerConfig, *, demo: bool = False) -> int:
    """:func:`rebaser_server.cli.serve.serve`, imported when called: it brings the daemon, nats-py and aiohttp."""
    serving = importlib.import_module("rebaser_server.cli.serve")
    code: int = await serving.serve(config, demo=demo)
    return code


class _Group(click.Group):
    """The ``rebaser-server`` group: ``dev-cluster`` is imported when it runs, and listed in ``--help`` from
    :data:`DEV_CLUSTER_SUMMARY`."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), "dev-cluster", "new-app"})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "dev-cluster":
            from rebaser_server.devtools.devcluster_command import command

            return command
        if cmd_name == "new-app":
            from rebaser_server.devtools.new_app import command as new_app

            return new_app
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([("dev-cluster", DEV_CLUSTER_SUMMARY), ("new-app", NEW_APP_SUMMARY)])


@click.group(
    cls=_Group,
    invoke_without_command=True,
    context_settings={"show_default": True, "max_content_width": 110},
)
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
@nats_connection_options
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
    "--intake",
    type=click.Choice(["fifo", "fair", "lanes"]),
    default=None,
    envvar="REBASER_INTAKE",
    show_envvar=True,
    help="How tasks reach daemons: lanes, the workspaces hashed onto 32 consumers per shard, each pulled on its own; "
    "fair, each workspace's in a queue of its own, the workspaces served in turns; fifo, in the order they came "
    "(docs/fair-share.md). Chosen when the layout is created (default: the layout's, else lanes).",
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
@embedded_server_options
@click.option(
    "--nats-monitoring-url",
    "nats_monitoring_urls",
    multiple=True,
    envvar="REBASER_NATS_MONITORING_URLS",
    show_envvar=True,
    help="Monitoring endpoint of an external NATS server, e.g. http://nats1:8222 (repeatable: one per server): "
    "its sync setting is checked at start-up and after every reconnect. None: durability shows as unknown.",
)
@tunable(
    "require_durability",
    click.Choice(["none", "node-loss", "power-loss"]),
    "Refuse to serve when acknowledged requests would survive less: node-loss (a node's crash or power loss) "
    "or power-loss (every server fsyncs before acknowledging).",
)
@health_endpoint_options
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
    intake: str | None,
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
    embedded_sync: str | None,
    nats_monitoring_urls: tuple[str, ...],
    require_durability: str,
    http_host: str,
    http_port: int,
    http_token: str | None,
    http_token_file: Path | None,
    demo: bool,
    log_level: str,
    log_format: LogFormat,
) -> None:
    """Run a rebaser daemon.

    Every option can also be given as the REBASER_* variable shown, or in the --config file; every other tunable
    (rebaser_core/settings.py) as REBASER_<FIELD> or in the --config file. Tracing is off unless the standard
    OTEL_TRACES_EXPORTER variable asks for it (console, or otlp with the rebaser[otlp] extra; OTEL_SERVICE_NAME,
    OTEL_EXPORTER_OTLP_ENDPOINT, ...).

    ``rebaser-server dev-cluster`` runs a local cluster instead, ``rebaser-server new-app NAME`` writes an app to
    start from (see their --help).
    """
    if ctx.invoked_subcommand is not None:
        return  # a subcommand (dev-cluster) takes its own options

    from rebaser_core.errors import DurabilityTooLow, LayoutMismatch
    from rebaser_core.nats.connect import ConnectOptions
    from rebaser_server.ops.tracing import TracingError, configure_tracing

    configure_logging(log_level, log_format)
    for line in unknown_variables(os.environ, known_variables(ctx.command)):
        log.warning("%s", line)  # a misspelled variable would be ignored silently otherwise
    try:
        tracing = configure_tracing()
    except TracingError as err:
        raise click.ClickException(str(err)) from None
    settings = settings_from(
        ctx.meta.get(FILE_SETTINGS, {}),
        config_path=ctx.meta.get(CONFIG_PATH),
        prefix=prefix,
        streams=streams,
        assignment=assignment,
        intake=intake,
        daemons=daemons,
        replica_index=replica_index,
        concurrency=concurrency,
        quiescent_period=quiescent_period,
        ack_wait=ack_wait,
        progress_period=progress_period,
        handler_deadline=handler_deadline,
        nats_monitoring_urls=nats_monitoring_urls or None,
        require_durability=require_durability,
    )
    connect_options = None
    if nats_urls and ctx.get_parameter_source("embedded_sync") not in (
        None,
        click.core.ParameterSource.DEFAULT,
    ):
        raise click.UsageError(
            "--sync sets the embedded server's fsync; an external NATS server's is in its own configuration "
            "(jetstream { sync_interval: always }): give its --nats-monitoring-url to have it checked"
        )
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
        embedded_sync=embedded_sync,
        http_host=http_host,
        http_port=http_port,
        http_token=http_token_from(http_token, http_token_file),
        log_format=log_format,
        **({"data_dir": data_dir} if data_dir else {}),
    )
    try:
        code = run_on_loop(serve(config, demo=demo), settings.event_loop)
    except (LayoutMismatch, DurabilityTooLow) as err:
        # A flag that disagrees with the cluster's shard layout, or a deployment that keeps acknowledged requests
        # less safely than --require-durability asks: one line, no traceback.
        raise click.ClickException(f"{type(err).__name__}: {err}") from None
    finally:
        if tracing is not None:
            tracing.shutdown()  # exports the spans still batched
    raise SystemExit(code)
