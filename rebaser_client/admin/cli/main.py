"""``rebaser``: the command group (the console script's ``main``), and the commands that send requests from the shell.
The operators' commands join it from the other modules of this package (``status``, ``change-set``, ``dlq``,
``wait``, ``watch``, ``workspace``, ``audit``; ``streams`` is below).

rebaser new-id                      (a fresh ULID, for workspaces and change sets)
rebaser enqueue --workspace W --change-set C --set /a=1 --set '/s="text"' --function /b=sum(/a,/c) --remove /d
rebaser request ... (same options; waits for and prints the reply)

Input mistakes are refused here, before anything is sent: a ``--set`` value must be JSON (a string is quoted:
``--set '/name="web"'``), paths must be attribute paths, function names identifiers.

A command answers at once: nats-py, pydantic and rich are imported by the commands that use them, never by
``--help``, ``--version`` or option parsing (``tests/unit/client/test_cli_import.py`` guards it;
``scripts/cli_timings.py`` measures it).
"""

from __future__ import annotations

import json
import re
import sys
from typing import TYPE_CHECKING, Any

import click

from rebaser_client.admin.cli import pause
from rebaser_client.admin.cli.audit import audit
from rebaser_client.admin.cli.change_set import change_set, wait
from rebaser_client.admin.cli.console import console
from rebaser_client.admin.cli.dlq import dlq
from rebaser_client.admin.cli.lazy_imports import defer_aiohttp
from rebaser_client.admin.cli.params import NATS_URL, SECONDS
from rebaser_client.admin.cli.status import status
from rebaser_client.admin.cli.watch import watch
from rebaser_core.errors import RebaserError, RebaserUnavailable
from rebaser_core.ids import ChangeSetId, RequestId, UlidId, WorkspacePk

if TYPE_CHECKING:
    from rebaser_client._sync import SyncRebaserClient
    from rebaser_core.api import SetFunction, SetLiteral, Update

_FUNCTION = re.compile(r"^(?P<path>[^=]+)=(?P<fn>[^(]*)\((?P<args>[^)]*)\)$")
# A function name as the built-in app registers them. The daemon's registry can be extended (register_function),
# so the client cannot know every valid name: it refuses what can never be one, the daemon refuses unknown ones.
_FUNCTION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,127}$")
# Same rule as the wire's AttributePath (rebaser_core/api/updates.py), checked here for a one-line message.
_PATH = re.compile(r"^(/[^/\s]+)+$")
_MAX_PATH = 1024

# A CLI call is one short exchange: when NATS is unreachable it should say so in one line, at once, rather than
# retry for the library's default connect budget and log every attempt.
CLI_CONNECT_TIMEOUT = 2.0


def _check_path(path: str, what: str = "path") -> str:
    if len(path) > _MAX_PATH or not _PATH.fullmatch(path):
        raise click.BadParameter(
            f"{what} {path!r} is not an attribute path: '/' followed by a segment without '/' or whitespace, "
            "one or more times (e.g. /web/port)"
        )
    return path


def _parse_set(text: str) -> SetLiteral:
    from rebaser_core.api import SetLiteral

    path, sep, raw = text.partition("=")
    if not sep:
        raise click.BadParameter(f"--set expects PATH=JSON, got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError as err:
        # Never guess: '{bad json' stored as a string would surface much later as a wrong value.
        raise click.BadParameter(
            f"--set {path}: {raw!r} is not JSON ({err}); to set a string, quote it: --set '{path}=\"text\"'"
        ) from None
    return SetLiteral(path=_check_path(path), value=value)


def _parse_function(text: str) -> SetFunction:
    from rebaser_core.api import SetFunction

    match = _FUNCTION.match(text)
    if not match:
        raise click.BadParameter(f"--function expects PATH=FUNCTION(/ARG,...), got {text!r}")
    name = match["fn"].strip()
    if not _FUNCTION_NAME.fullmatch(name):
        raise click.BadParameter(f"--function {text!r}: {name!r} is not a function name")
    args = [_check_path(a.strip(), "argument") for a in match["args"].split(",") if a.strip()]
    return SetFunction(path=_check_path(match["path"].strip()), function=name, args=args)


def _updates(sets: tuple[str, ...], functions: tuple[str, ...], removes: tuple[str, ...]) -> list[Update]:
    from rebaser_core.api import Remove

    return [
        *map(_parse_set, sets),
        *map(_parse_function, functions),
        *(Remove(path=_check_path(p)) for p in removes),
    ]


def _id(cls: type[UlidId], value: str, option: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a ULID (26 characters of Crockford base32); get one with `rebaser new-id`",
            param_hint=option,
        ) from None


def _connect(nats_url: str, prefix: str | None) -> SyncRebaserClient:
    from rebaser_client._sync import SyncRebaserClient
    from rebaser_client.admin.cli.common import inbox_prefix
    from rebaser_core.nats.connect import ConnectOptions, redact_url

    errors: list[Exception] = []

    async def remember(err: Exception) -> None:
        errors.append(err)  # nats-py reports every failed attempt here; the user sees the last one, once

    options = ConnectOptions(
        servers=(nats_url,),
        inbox_prefix=inbox_prefix(),
        connect_timeout=CLI_CONNECT_TIMEOUT,
        # nats-py retries a server until it has failed max_reconnect_attempts + 1 times (0 means forever), waiting
        # reconnect_time_wait in between: 1 and a short wait make it two quick attempts, then the answer.
        extra={"max_reconnect_attempts": 1, "reconnect_time_wait": 0.1, "error_cb": remember},
    )
    try:
        streams = click.get_current_context().meta.get("rebaser.streams")
        return SyncRebaserClient(options, prefix=prefix, streams=streams)
    except RebaserUnavailable as err:
        if not errors:
            raise
        raise RebaserUnavailable(
            f"cannot connect to NATS at {redact_url(nats_url)}: {errors[-1]} "
            "(is the daemon running, e.g. `make serve`? --nats-url / REBASER_NATS_URL set the address)"
        ) from err


def _decorate(f: Any, decorators: list[Any]) -> Any:
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


def _remember_streams(ctx: click.Context, _param: click.Parameter, value: int | None) -> None:
    ctx.meta["rebaser.streams"] = value


def _target_options(f: Any) -> Any:
    """Where to connect and which change set."""
    return _decorate(
        f,
        [
            click.option(
                "--nats-url",
                envvar="REBASER_NATS_URL",
                type=NATS_URL,
                default="nats://127.0.0.1:4222",
                show_default=True,
            ),
            click.option(
                "--prefix", envvar="REBASER_PREFIX", default=None, help="Subject prefix of the deployment."
            ),
            click.option(
                "--streams",
                envvar="REBASER_STREAMS",
                type=click.IntRange(1, 64),
                default=None,
                expose_value=False,
                callback=_remember_streams,
                help="Shards the deployment has (checked against the cluster's layout; default: follow it).",
            ),
            click.option("--workspace", "workspace", required=True, help="Workspace ULID."),
            click.option("--change-set", "change_set", required=True, help="Change set ULID."),
        ],
    )


def _options(f: Any) -> Any:
    """A request: the target plus its updates."""
    return _target_options(
        _decorate(
            f,
            [
                click.option(
                    "--from-change-set", default=None, help="Apply this change set's changes instead."
                ),
                click.option(
                    "--set",
                    "sets",
                    multiple=True,
                    help="PATH=JSON literal (a string is quoted: '/a=\"text\"').",
                ),
                click.option("--function", "functions", multiple=True, help="PATH=FUNCTION(/ARG,...)."),
                click.option("--remove", "removes", multiple=True, help="PATH to remove."),
            ],
        )
    )


@click.group()
@click.version_option(package_name="rebaser", prog_name="rebaser")
def main() -> None:
    """rebaser client and admin commands."""
    defer_aiohttp()  # a subcommand runs next, and most never use aiohttp (nats-py imports it with itself)


# The operators' commands, each module of this package one command or group (and `streams`, below).
for _command in (status, change_set, dlq, wait, watch, console, audit):
    main.add_command(_command)
pause.register(main)  # change-set pause/resume/skip, and the workspace group


@main.command("new-id")
@click.option("--count", "-n", default=1, show_default=True, help="How many ids to print, one a line.")
def new_id(count: int) -> None:
    """Print a fresh ULID: an id for a workspace, a change set or a request (e.g. WK=$(rebaser new-id))."""
    for _ in range(count):
        click.echo(str(RequestId.new()))


def _fail(err: RebaserError) -> click.ClickException:
    return click.ClickException(f"{type(err).__name__}: {err}")


@main.command()
@_options
def enqueue(
    nats_url: str,
    prefix: str | None,
    workspace: str,
    change_set: str,
    from_change_set: str | None,
    sets: tuple[str, ...],
    functions: tuple[str, ...],
    removes: tuple[str, ...],
) -> None:
    """Enqueue a request; print its id once it is durable."""
    updates = _updates(sets, functions, removes)
    wk, cs = _id(WorkspacePk, workspace, "--workspace"), _id(ChangeSetId, change_set, "--change-set")
    source = _id(ChangeSetId, from_change_set, "--from-change-set") if from_change_set else None
    try:
        with _connect(nats_url, prefix) as client:
            if source is not None:
                rid = client.enqueue_updates_from_change_set(wk, cs, source, updates=updates)
            else:
                rid = client.enqueue_updates(wk, cs, updates)
    except RebaserError as err:
        raise _fail(err) from None
    click.echo(str(rid))


@main.command()
@_options
@click.option(
    "--timeout", type=SECONDS, default=30.0, show_default=True, help="Seconds to wait for the reply."
)
def request(
    nats_url: str,
    prefix: str | None,
    workspace: str,
    change_set: str,
    from_change_set: str | None,
    sets: tuple[str, ...],
    functions: tuple[str, ...],
    removes: tuple[str, ...],
    timeout: float,
) -> None:
    """Enqueue a request and print the reply as JSON (exit 1 unless it succeeded)."""
    updates = _updates(sets, functions, removes)
    wk, cs = _id(WorkspacePk, workspace, "--workspace"), _id(ChangeSetId, change_set, "--change-set")
    source = _id(ChangeSetId, from_change_set, "--from-change-set") if from_change_set else None
    try:
        with _connect(nats_url, prefix) as client:
            if source is not None:
                response = client.enqueue_updates_from_change_set_with_reply(
                    wk, cs, source, updates=updates, timeout=timeout
                )
            else:
                response = client.enqueue_updates_with_reply(wk, cs, updates, timeout=timeout)
    except RebaserError as err:
        raise _fail(err) from None
    click.echo(json.dumps(response.model_dump(mode="json"), indent=2))
    sys.exit(0 if response.ok else 1)


@main.command()
@_target_options
@click.option("--path", default=None, help="Only this attribute.")
def get(nats_url: str, prefix: str | None, workspace: str, change_set: str, path: str | None) -> None:
    """Print a change set's values, snapshot address and whether a DVU is pending, as JSON.

    Exit 1 with a message if the change set, or the --path asked for, does not exist."""
    wk, cs = _id(WorkspacePk, workspace, "--workspace"), _id(ChangeSetId, change_set, "--change-set")
    if path is not None:
        _check_path(path)
    try:
        with _connect(nats_url, prefix) as client:
            response = client.get_change_set(wk, cs, path)
    except RebaserError as err:
        raise _fail(err) from None
    if not response.exists:
        raise click.ClickException(f"change set {cs} does not exist in workspace {wk}")
    if path is not None and path not in response.values:
        # The query answers "no values" for an absent path; an empty object would read as success.
        raise click.ClickException(f"path {path} does not exist in change set {cs}")
    data = response.model_dump(mode="json", exclude={"id", "error"})
    click.echo(json.dumps(data, indent=2))


@main.command()
@_target_options
@click.option("--from-change-set", "from_change_set", required=True, help="The change set to fork.")
def fork(nats_url: str, prefix: str | None, workspace: str, change_set: str, from_change_set: str) -> None:
    """Create a change set as a fork of another, at that one's current snapshot; print its snapshot address."""
    wk, cs = _id(WorkspacePk, workspace, "--workspace"), _id(ChangeSetId, change_set, "--change-set")
    source = _id(ChangeSetId, from_change_set, "--from-change-set")
    try:
        with _connect(nats_url, prefix) as client:
            response = client.fork_change_set(wk, cs, source)
    except RebaserError as err:
        raise _fail(err) from None
    click.echo(response.snapshot_address or "")


@main.group("streams")
def streams_group() -> None:
    """Admin: the shard layout (how many request and task streams), each shard's leader, backlog and consumers."""


@streams_group.command("show")
@click.option(
    "--nats-url", envvar="REBASER_NATS_URL", type=NATS_URL, default="nats://127.0.0.1:4222", show_default=True
)
@click.option("--prefix", envvar="REBASER_PREFIX", default=None, help="Subject prefix of the deployment.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def streams_show(nats_url: str, prefix: str | None, as_json: bool) -> None:
    """Show the layout and, per shard, its leader, backlog, tasks and consumers."""
    from rebaser_client.admin.cli.streams import show

    show(nats_url, prefix, as_json)


@streams_group.command("set")
@click.argument("streams", type=click.IntRange(1, 64))
@click.option(
    "--nats-url", envvar="REBASER_NATS_URL", type=NATS_URL, default="nats://127.0.0.1:4222", show_default=True
)
@click.option("--prefix", envvar="REBASER_PREFIX", default=None, help="Subject prefix of the deployment.")
@click.option("--daemons", type=click.IntRange(1), default=None, help="Pinned mode: the daemons (R <= N).")
@click.option(
    "--timeout",
    type=SECONDS,
    default=600.0,
    show_default=True,
    help="Seconds to wait for the old shards to drain.",
)
@click.option(
    "--assignment", type=click.Choice(["shared", "pinned"]), default=None, help="Change the mode too."
)
def streams_set(
    nats_url: str, prefix: str | None, streams: int, daemons: int | None, timeout: float, assignment: Any
) -> None:
    """Change the number of shards online: new requests go to the new shards at once; what is queued in a
    change set's old shard is applied first; then the layout settles and removed shards are deleted."""
    from rebaser_client.admin.cli.streams import set_streams

    set_streams(nats_url, prefix, streams, daemons, timeout, assignment)


@streams_group.command("repair")
@click.option(
    "--nats-url", envvar="REBASER_NATS_URL", type=NATS_URL, default="nats://127.0.0.1:4222", show_default=True
)
@click.option("--prefix", envvar="REBASER_PREFIX", default=None, help="Subject prefix of the deployment.")
@click.option(
    "--assignment",
    type=click.Choice(["shared", "pinned"]),
    default=None,
    help="The mode (default: as it was).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def streams_repair(nats_url: str, prefix: str | None, assignment: Any, as_json: bool) -> None:
    """Rewrite an unreadable layout entry (daemons wait for it, /readyz says so): the last readable layout if it
    agrees with the streams that exist, else one made from them. Refused if the entry reads."""
    from rebaser_client.admin.cli.streams import repair

    repair(nats_url, prefix, assignment, as_json)


@streams_group.command("intake")
@click.argument("intake", type=click.Choice(["fifo", "fair", "lanes"]))
@click.option(
    "--nats-url", envvar="REBASER_NATS_URL", type=NATS_URL, default="nats://127.0.0.1:4222", show_default=True
)
@click.option("--prefix", envvar="REBASER_PREFIX", default=None, help="Subject prefix of the deployment.")
def streams_intake(nats_url: str, prefix: str | None, intake: Any) -> None:
    """Change how tasks reach the daemons online (docs/fair-share.md): the daemons hand back what they own, the old
    intake's consumers go, and after their ack_wait the daemons take tasks through the new one. Nothing queued
    moves or is lost; no change set is applied for a few seconds."""
    from rebaser_client.admin.cli.streams import set_intake

    set_intake(nats_url, prefix, intake)
