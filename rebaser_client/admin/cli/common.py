"""What the ``rebaser`` operator commands share: the connection options, ``--json`` and ``--limit``, ids checked
before anything is sent, one connection per command, one line for an error, tables that fit, progress bars and the
question before something is deleted or sent again.

Tables for people, JSON with ``--json``. Operator mistakes (NATS unreachable, an unknown change set or dead letter, a
bad id) are one line and a non-zero exit. The commands only parse options and print: the reads and writes are in
``rebaser_client.admin`` (and the library), the formatting in :mod:`rebaser_client.admin.format`.

nats-py and rich are imported by the commands that use them, once their options are checked, not with this module:
``rebaser --help`` and a mistyped option must answer at once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import click

from rebaser_client.admin.cli.params import NATS_URL
from rebaser_client.admin.format_actions import plural
from rebaser_core.errors import RebaserError, RebaserUnavailable
from rebaser_core.ids import UlidId
from rebaser_core.nats.connect import ConnectOptions, close_connection, connect, redact_url
from rebaser_core.subjects import Subjects

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from rich.console import Console

__all__ = [
    "Audited",
    "admin_connect",
    "confirm",
    "confirm_connected",
    "connection_options",
    "console",
    "error_line",
    "json_option",
    "limit_option",
    "parse_ulid",
    "plural",
    "print_json",
    "progress_bar",
    "record_action",
    "run",
    "subjects_of",
]

T = TypeVar("T")
_F = TypeVar("_F", bound=Callable[..., Any])
_WIDE = 200  # tables written to a pipe or file are not wrapped at 80 columns (ids are 26 characters)
# One quick connect attempt and one retry, as the other CLI commands do (docs/design.md §6).
_CONNECT_TIMEOUT = 2.0


def connection_options(f: Any) -> Any:
    f = click.option(
        "--prefix", envvar="REBASER_PREFIX", default=None, help="Subject prefix of the deployment."
    )(f)
    f = click.option(
        "--nats-url",
        envvar="REBASER_NATS_URL",
        type=NATS_URL,
        default="nats://127.0.0.1:4222",
        show_default=True,
    )(f)
    return f


def limit_option(default: int, help_text: str) -> Callable[[_F], _F]:
    """``--limit``: how many items a listing shows at most."""
    return click.option(
        "--limit", default=default, show_default=True, type=click.IntRange(min=0), help=help_text
    )


def json_option(f: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(f)


def parse_ulid(cls: type[UlidId], value: str, what: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a ULID (26 characters of Crockford base32)", param_hint=what
        ) from None


def inbox_prefix() -> str | None:
    """``REBASER_NATS_INBOX_PREFIX``: the inbox prefix a caller in an account of its own connects with (its account
    imports only that prefix, docs/accounts.md), e.g. ``_INBOX.client-1``; unset: nats-py's."""
    return os.environ.get("REBASER_NATS_INBOX_PREFIX") or None


def subjects_of(prefix: str | None) -> Subjects:
    try:
        return Subjects(prefix)
    except RebaserError as err:
        raise click.BadParameter(str(err), param_hint="--prefix") from None


def error_line(err: RebaserError) -> str:
    """The one line for an error: its class and message; a dead letter that is not there reads the same from every
    command (``dlq show`` says it without a class)."""
    from rebaser_client.admin.dead_letters import NoDeadLetter

    return str(err) if isinstance(err, NoDeadLetter) else f"{type(err).__name__}: {err}"


async def admin_connect(nats_url: str) -> NatsClient:
    """A connection for one admin command: fails in about a second with one line if NATS is unreachable."""
    errors: list[Exception] = []

    async def remember(err: Exception) -> None:
        errors.append(err)

    options = ConnectOptions(
        servers=(nats_url,),
        inbox_prefix=inbox_prefix(),
        connect_timeout=_CONNECT_TIMEOUT,
        extra={"max_reconnect_attempts": 1, "reconnect_time_wait": 0.1, "error_cb": remember},
    )
    try:
        return await connect(options)
    except Exception as err:
        why = errors[-1] if errors else err
        raise RebaserUnavailable(
            f"cannot connect to NATS at {redact_url(nats_url)}: {why} "
            "(is the daemon running? --nats-url / REBASER_NATS_URL set the address)"
        ) from None


@dataclass
class Audited:
    """An action a command does, for the audit trail (:mod:`rebaser_client.admin.audit`): its name, its targets
    (``work`` may name them once it has looked them up) and, once done, what it did (``lines`` of its result)."""

    what: str
    subjects: Subjects
    targets: list[str] = field(default_factory=list)
    lines: Callable[[Any], list[str]] = lambda result: []


async def record_action(nc: NatsClient, audited: Audited, outcome: str, lines: list[str]) -> None:
    """Record ``audited`` in the audit trail; if that fails, say on stderr that the entry is missing (and go on)."""
    from rebaser_client.admin.audit import cli_identity, make_entry, missing_line, record

    entry = make_entry(
        who=cli_identity(),
        source="cli",
        what=audited.what,
        targets=audited.targets,
        outcome=outcome,
        lines=lines,
    )
    why = await record(nc, audited.subjects, entry)
    if why is not None:
        click.echo(f"rebaser: {missing_line(why)}", err=True)


def run(nats_url: str, work: Callable[[NatsClient], Awaitable[T]], *, audited: Audited | None = None) -> T:
    """Connect, run ``work``, close; a RebaserError becomes one line and exit status 1. With ``audited``, the
    action is recorded in the audit trail once done (or once it failed); a record that cannot be written is said on
    stderr and changes neither the outcome nor the exit status."""
    import asyncio

    async def main() -> T:
        nc = await admin_connect(nats_url)
        try:
            if audited is None:
                return await work(nc)
            try:
                result = await work(nc)
            except RebaserError as err:
                await record_action(nc, audited, "failed", [error_line(err)])
                raise
            try:
                lines = audited.lines(result)
            except Exception as err:  # the record's wording must never cost the action's output
                lines = [f"(not described: {err!r})"]
            await record_action(nc, audited, "ok", lines)
            return result
        finally:
            await close_connection(nc)

    try:
        return asyncio.run(main())
    except RebaserError as err:
        raise click.ClickException(error_line(err)) from None


def console() -> Console:
    from rich.console import Console

    out = Console()
    return out if out.is_terminal else Console(width=_WIDE)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


@contextmanager
def progress_bar(description: str, *, enabled: bool) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr for long operations (only on a terminal, and never with --json)."""
    from rich.console import Console

    stderr = Console(stderr=True)
    if not enabled or not stderr.is_terminal:
        yield lambda done, total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def confirm(yes: bool, question: str) -> None:
    # On stderr: with --json, stdout holds only the answer.
    if not yes and not click.confirm(question, default=False, err=True):
        raise click.ClickException("not confirmed (pass --yes to skip the question)")


async def confirm_connected(yes: bool, question: str) -> None:
    """Ask while connected, from a thread: the connection keeps answering the server's pings meanwhile."""
    import asyncio

    if not yes:
        await asyncio.to_thread(confirm, yes, question)
