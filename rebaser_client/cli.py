"""``rebaser``: enqueue requests from the shell.

rebaser enqueue --workspace W --change-set C --set /a=1 --function /b=sum(/a,/c) --remove /d
rebaser request ... (same options; waits for and prints the reply)
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import click

from rebaser_client._sync import SyncRebaserClient
from rebaser_core.api import Remove, SetFunction, SetLiteral, Update
from rebaser_core.errors import RebaserError
from rebaser_core.ids import ChangeSetId, WorkspacePk

_FUNCTION = re.compile(r"^(?P<path>[^=]+)=(?P<fn>[A-Za-z_][\w-]*)\((?P<args>[^)]*)\)$")


def _parse_set(text: str) -> SetLiteral:
    path, sep, raw = text.partition("=")
    if not sep:
        raise click.BadParameter(f"expected PATH=JSON, got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw  # a bare word is a string
    return SetLiteral(path=path, value=value)


def _parse_function(text: str) -> SetFunction:
    match = _FUNCTION.match(text)
    if not match:
        raise click.BadParameter(f"expected PATH=FUNCTION(ARG,...), got {text!r}")
    args = [a.strip() for a in match["args"].split(",") if a.strip()]
    return SetFunction(path=match["path"], function=match["fn"], args=args)


def _updates(sets: tuple[str, ...], functions: tuple[str, ...], removes: tuple[str, ...]) -> list[Update]:
    try:
        return [*map(_parse_set, sets), *map(_parse_function, functions), *(Remove(path=p) for p in removes)]
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def _decorate(f: Any, decorators: list[Any]) -> Any:
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


def _target_options(f: Any) -> Any:
    """Where to connect and which change set."""
    return _decorate(
        f,
        [
            click.option(
                "--nats-url", envvar="REBASER_NATS_URL", default="nats://127.0.0.1:4222", show_default=True
            ),
            click.option(
                "--prefix", envvar="REBASER_PREFIX", default=None, help="Subject prefix of the deployment."
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
                click.option("--set", "sets", multiple=True, help="PATH=JSON literal."),
                click.option("--function", "functions", multiple=True, help="PATH=FUNCTION(ARG,...)."),
                click.option("--remove", "removes", multiple=True, help="PATH to remove."),
            ],
        )
    )


@click.group()
@click.version_option(package_name="rebaser", prog_name="rebaser")
def main() -> None:
    """rebaser client and admin commands."""


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
    try:
        with SyncRebaserClient(nats_url, prefix=prefix) as client:
            wk, cs = WorkspacePk(workspace), ChangeSetId(change_set)
            if from_change_set:
                rid = client.enqueue_updates_from_change_set(
                    wk, cs, ChangeSetId(from_change_set), updates=updates
                )
            else:
                rid = client.enqueue_updates(wk, cs, updates)
    except RebaserError as err:
        raise click.ClickException(f"{type(err).__name__}: {err}") from None
    click.echo(str(rid))


@main.command()
@_options
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the reply.")
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
    try:
        with SyncRebaserClient(nats_url, prefix=prefix) as client:
            wk, cs = WorkspacePk(workspace), ChangeSetId(change_set)
            if from_change_set:
                response = client.enqueue_updates_from_change_set_with_reply(
                    wk, cs, ChangeSetId(from_change_set), updates=updates, timeout=timeout
                )
            else:
                response = client.enqueue_updates_with_reply(wk, cs, updates, timeout=timeout)
    except RebaserError as err:
        raise click.ClickException(f"{type(err).__name__}: {err}") from None
    click.echo(json.dumps(response.model_dump(mode="json"), indent=2))
    sys.exit(0 if response.ok else 1)


@main.command()
@_target_options
@click.option("--path", default=None, help="Only this attribute.")
def get(nats_url: str, prefix: str | None, workspace: str, change_set: str, path: str | None) -> None:
    """Print a change set's values, snapshot address and whether a DVU is pending, as JSON."""
    try:
        with SyncRebaserClient(nats_url, prefix=prefix) as client:
            response = client.get_change_set(WorkspacePk(workspace), ChangeSetId(change_set), path)
    except (RebaserError, ValueError) as err:
        raise click.ClickException(f"{type(err).__name__}: {err}") from None
    data = response.model_dump(mode="json", exclude={"id", "error"})
    click.echo(json.dumps(data, indent=2))


@main.command()
@_target_options
@click.option("--from-change-set", "from_change_set", required=True, help="The change set to fork.")
def fork(nats_url: str, prefix: str | None, workspace: str, change_set: str, from_change_set: str) -> None:
    """Create a change set as a fork of another, at that one's current snapshot."""
    try:
        with SyncRebaserClient(nats_url, prefix=prefix) as client:
            response = client.fork_change_set(
                WorkspacePk(workspace), ChangeSetId(change_set), ChangeSetId(from_change_set)
            )
    except (RebaserError, ValueError) as err:
        raise click.ClickException(f"{type(err).__name__}: {err}") from None
    click.echo(response.snapshot_address or "")
