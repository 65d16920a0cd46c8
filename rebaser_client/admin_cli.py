"""``rebaser`` admin commands: status, change-set show/purge, dlq list/show/replay/drop, wait (``change-set
pause/resume/skip`` and ``workspace`` are in ``pause_cli``).

Tables for people, JSON with ``--json``. Operator mistakes (NATS unreachable, an unknown change set or dead letter, a
bad id) are one line and a non-zero exit. JetStream reads and writes are in ``_admin``/``_admin_ops``, the
formatting in ``_admin_format``; this module only parses options and prints.

What deletes or re-sends something asks first (``--yes`` skips the question): ``change-set purge``, ``dlq replay``
and ``dlq drop``. The dead letters named are looked up before the question, so a sequence that holds none is the
same one line for ``dlq show``, ``replay`` and ``drop``, and nothing is done.

nats-py and rich are imported by the commands that use them, once their options are checked, not with this module:
``rebaser --help`` and a mistyped option must answer at once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from rebaser_client._cli_types import NATS_URL, SECONDS
from rebaser_core.errors import RebaserError
from rebaser_core.ids import ChangeSetId, UlidId, WorkspacePk
from rebaser_core.subjects import Subjects

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from rich.console import Console

    from rebaser_client._admin_dlq import DeadLetter

__all__ = ["ADMIN_COMMANDS"]

T = TypeVar("T")
_F = TypeVar("_F", bound=Callable[..., Any])
_WIDE = 200  # tables written to a pipe or file are not wrapped at 80 columns (ids are 26 characters)


def _connection_options(f: Any) -> Any:
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


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """``1 dead letter``, ``3 dead letters``, ``0 requests``."""
    return f"{count} {singular if count == 1 else plural_form or singular + 's'}"


def _limit_option(default: int, help_text: str) -> Callable[[_F], _F]:
    """``--limit``: how many items a listing shows at most."""
    return click.option(
        "--limit", default=default, show_default=True, type=click.IntRange(min=0), help=help_text
    )


def _json_option(f: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(f)


def _ulid(cls: type[UlidId], value: str, what: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a ULID (26 characters of Crockford base32)", param_hint=what
        ) from None


def _subjects(prefix: str | None) -> Subjects:
    try:
        return Subjects(prefix)
    except RebaserError as err:
        raise click.BadParameter(str(err), param_hint="--prefix") from None


def _message(err: RebaserError) -> str:
    """The one line for an error: its class and message; a dead letter that is not there reads the same from every
    command (``dlq show`` says it without a class)."""
    from rebaser_client._admin_dlq import NoDeadLetter

    return str(err) if isinstance(err, NoDeadLetter) else f"{type(err).__name__}: {err}"


def _run(nats_url: str, work: Callable[[NatsClient], Awaitable[T]]) -> T:
    """Connect, run ``work``, close; a RebaserError becomes one line and exit status 1."""
    import asyncio

    from rebaser_client._admin import admin_connect
    from rebaser_core.connect import close_connection

    async def main() -> T:
        nc = await admin_connect(nats_url)
        try:
            return await work(nc)
        finally:
            await close_connection(nc)

    try:
        return asyncio.run(main())
    except RebaserError as err:
        raise click.ClickException(_message(err)) from None


def _console() -> Console:
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=_WIDE)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


@contextmanager
def _progress(description: str, *, enabled: bool) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr for long operations (only on a terminal, and never with --json)."""
    from rich.console import Console

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield lambda done, total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _confirm(yes: bool, question: str) -> None:
    # On stderr: with --json, stdout holds only the answer.
    if not yes and not click.confirm(question, default=False, err=True):
        raise click.ClickException("not confirmed (pass --yes to skip the question)")


async def _confirm_connected(yes: bool, question: str) -> None:
    """Ask while connected, from a thread: the connection keeps answering the server's pings meanwhile."""
    import asyncio

    if not yes:
        await asyncio.to_thread(_confirm, yes, question)


# -- status ---------------------------------------------------------------------------------------------------------
@click.command()
@_connection_options
@_json_option
@_limit_option(50, "Change sets listed (the busiest first).")
@click.option(
    "--nats-monitoring-url",
    "monitoring_urls",
    multiple=True,
    envvar="REBASER_NATS_MONITORING_URLS",
    help="Monitoring endpoint of each NATS server (http://host:8222), to read its sync setting for the durability "
    "line (none: shown as unknown unless the streams are replicated).",
)
@click.option(
    "--daemon-url",
    "daemon_urls",
    multiple=True,
    envvar="REBASER_DAEMON_URLS",
    help="Health endpoint of each daemon (http://host:9464), to read the change sets it owns per workspace (none: "
    "each workspace's owned and waiting change sets are shown as unknown).",
)
def status(
    nats_url: str,
    prefix: str | None,
    as_json: bool,
    limit: int,
    monitoring_urls: tuple[str, ...],
    daemon_urls: tuple[str, ...],
) -> None:
    """Streams, the tasks consumer, owners, backlogs, the busiest workspaces, dead letters and durability of the
    deployment."""
    subjects = _subjects(prefix)
    from rebaser_client import _admin_format as fmt
    from rebaser_client._admin import status_report

    with _progress("reading change sets", enabled=not as_json) as progress:
        report = _run(
            nats_url,
            lambda nc: status_report(
                nc,
                subjects,
                limit=limit,
                progress=progress,
                monitoring_urls=monitoring_urls,
                daemon_urls=daemon_urls,
            ),
        )
    if as_json:
        _print_json(fmt.status_json(report))
    else:
        _console().print(fmt.status_view(report))


# -- change-set ------------------------------------------------------------------------------------------------------
@click.group("change-set")
def change_set() -> None:
    """Inspect, purge, pause, resume one change set, or skip its first request."""


@change_set.command("show")
@click.argument("workspace")
@click.argument("change_set_id", metavar="CHANGE_SET")
@_connection_options
@_json_option
@_limit_option(50, "Queued requests listed (the first in line).")
def change_set_show(
    workspace: str, change_set_id: str, nats_url: str, prefix: str | None, as_json: bool, limit: int
) -> None:
    """Queued requests (age, id, what), owner and epoch, DVU pending, the last replies."""
    wk, cs = _ulid(WorkspacePk, workspace, "WORKSPACE"), _ulid(ChangeSetId, change_set_id, "CHANGE_SET")
    subjects = _subjects(prefix)
    from rebaser_client import _admin_format as fmt
    from rebaser_client._admin import change_set_report

    with _progress("reading queued requests", enabled=not as_json) as progress:
        report = _run(
            nats_url, lambda nc: change_set_report(nc, subjects, wk, cs, limit=limit, progress=progress)
        )
    if report is None:
        raise click.ClickException(
            f"change set {wk}/{cs} is unknown: no record, no queued request, no task, no dead letter"
        )
    if as_json:
        _print_json(fmt.change_set_json(report))
    else:
        _console().print(fmt.change_set_view(report))


@change_set.command("purge")
@click.argument("workspace")
@click.argument("change_set_id", metavar="CHANGE_SET")
@_connection_options
@_json_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def change_set_purge(
    workspace: str, change_set_id: str, nats_url: str, prefix: str | None, as_json: bool, yes: bool
) -> None:
    """Remove every queued request of a change set (their callers get no reply). A daemon that owns the change set
    still applies the requests it has already read."""
    wk, cs = _ulid(WorkspacePk, workspace, "WORKSPACE"), _ulid(ChangeSetId, change_set_id, "CHANGE_SET")
    subjects = _subjects(prefix)
    from rebaser_client._admin_ops import purge_change_set

    _confirm(yes, f"Remove every queued request of change set {wk}/{cs}?")
    result = _run(nats_url, lambda nc: purge_change_set(nc, subjects, wk, cs))
    if as_json:
        _print_json({"removed": result.removed, "upto_seq": result.upto_seq, "task": result.task})
        return
    if not result.upto_seq:
        click.echo(f"nothing queued for {wk}/{cs}: nothing removed")
        return
    # Processed requests still waiting for their purge are removed (and counted) too: they were done already.
    click.echo(
        f"removed {plural(result.removed, 'request')} of {wk}/{cs} (all stored up to sequence {result.upto_seq})"
    )
    if result.task == "owned":
        click.echo("note: a daemon owns the change set; it still applies the requests it had already read")


# -- dlq --------------------------------------------------------------------------------------------------------------
@click.group()
def dlq() -> None:
    """List, show, replay or drop dead letters."""


def _filter(
    workspace: str | None, change_set_id: str | None
) -> tuple[WorkspacePk | None, ChangeSetId | None]:
    if (workspace is None) != (change_set_id is None):
        raise click.UsageError("--workspace and --change-set go together")
    if workspace is None or change_set_id is None:
        return None, None
    return _ulid(WorkspacePk, workspace, "--workspace"), _ulid(ChangeSetId, change_set_id, "--change-set")


def _filter_options(f: Any) -> Any:
    f = click.option("--change-set", "change_set_id", default=None, help="Only this change set's.")(f)
    f = click.option(
        "--workspace", default=None, help="Only this workspace's change set (with --change-set)."
    )(f)
    return f


@dlq.command("list")
@_connection_options
@_json_option
@_filter_options
@_limit_option(50, "Dead letters listed (the oldest first).")
def dlq_list(
    nats_url: str,
    prefix: str | None,
    as_json: bool,
    workspace: str | None,
    change_set_id: str | None,
    limit: int,
) -> None:
    """Dead letters, oldest first, with the reason."""
    wk, cs = _filter(workspace, change_set_id)
    subjects = _subjects(prefix)
    from rebaser_client import _admin_format as fmt
    from rebaser_client._admin_dlq import dead_letters

    with _progress("reading dead letters", enabled=not as_json) as progress:
        total, letters = _run(
            nats_url,
            lambda nc: dead_letters(
                nc, subjects, workspace_id=wk, change_set_id=cs, limit=limit, progress=progress
            ),
        )
    if as_json:
        _print_json(fmt.dead_letters_json(total, letters))
    else:
        _console().print(fmt.dead_letters_view(total, letters, datetime.now(UTC)))


@dlq.command("show")
@click.argument("seq", type=click.IntRange(min=1))
@_connection_options
@_json_option
def dlq_show(seq: int, nats_url: str, prefix: str | None, as_json: bool) -> None:
    """One dead letter: why, where from, its headers and the request."""
    subjects = _subjects(prefix)
    from rebaser_client import _admin_format as fmt
    from rebaser_client._admin_dlq import NoDeadLetter, dead_letter

    letter = _run(nats_url, lambda nc: dead_letter(nc, subjects, seq))
    if letter is None:
        raise click.ClickException(_message(NoDeadLetter(seq)))
    if as_json:
        _print_json(fmt.dead_letter_json(letter, full=True))
    else:
        _console().print(fmt.dead_letter_view(letter))


def _letters_named(seqs: tuple[int, ...]) -> str:
    return f"dead letter {seqs[0]}" if len(seqs) == 1 else f"dead letters {', '.join(map(str, seqs))}"


def _of(wk: WorkspacePk | None, cs: ChangeSetId | None) -> str:
    return f" of {wk}/{cs}" if cs else ""


async def _named_letters(nc: NatsClient, subjects: Subjects, seqs: tuple[int, ...]) -> list[DeadLetter]:
    """The dead letters at ``seqs``; :class:`NoDeadLetter` for the first sequence that holds none."""
    from rebaser_client._admin_dlq import NoDeadLetter, dead_letter

    found: list[DeadLetter] = []
    for seq in seqs:
        letter = await dead_letter(nc, subjects, seq)
        if letter is None:
            raise NoDeadLetter(seq)
        found.append(letter)
    return found


@dlq.command("replay")
@click.argument("seqs", nargs=-1, type=click.IntRange(min=1))
@_connection_options
@_json_option
@_filter_options
@click.option("--all", "everything", is_flag=True, help="Replay every dead letter (or the change set's).")
@_limit_option(1000, "With --all: at most this many.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def dlq_replay(
    seqs: tuple[int, ...],
    nats_url: str,
    prefix: str | None,
    as_json: bool,
    workspace: str | None,
    change_set_id: str | None,
    everything: bool,
    limit: int,
    yes: bool,
) -> None:
    """Publish dead letters again as new requests (a fresh id each, derived from the dead letter so a replay is
    never applied twice), give their change sets a task, delete each dead letter once its replay is stored.

    Asks first (--yes does not); dead letters given by sequence are checked before that: if one is missing or
    cannot be replayed, nothing is."""
    wk, cs = _filter(workspace, change_set_id)
    if bool(seqs) == everything:
        raise click.UsageError("give dead-letter sequences, or --all")
    subjects = _subjects(prefix)
    from rebaser_client._admin_dlq import dead_letters
    from rebaser_client._admin_ops import check_replayable, replay_dead_letter

    async def work(nc: NatsClient) -> list[dict[str, Any]]:
        if everything:
            total, letters = await dead_letters(nc, subjects, workspace_id=wk, change_set_id=cs, limit=limit)
            targets = [d.seq for d in letters]
            if not targets:
                return []
            if total > len(targets):
                click.echo(
                    f"replaying the oldest {len(targets)} of {plural(total, 'dead letter')} (--limit)",
                    err=True,
                )
            await _confirm_connected(yes, f"Replay {plural(len(targets), 'dead letter')}{_of(wk, cs)}?")
        else:
            for letter in await _named_letters(nc, subjects, seqs):
                check_replayable(letter)
            targets = list(seqs)
            await _confirm_connected(yes, f"Replay {_letters_named(seqs)} as new requests?")
        done: list[dict[str, Any]] = []
        with _progress("replaying", enabled=not as_json and len(targets) > 1) as progress:
            for seq in targets:
                try:
                    r = await replay_dead_letter(nc, subjects, seq)
                except RebaserError as err:
                    if not everything:
                        raise
                    done.append({"dead_letter_seq": seq, "error": _message(err)})
                else:
                    done.append(
                        {
                            "dead_letter_seq": r.dead_letter_seq,
                            "original_id": r.original_id,
                            "request_id": r.request_id,
                            "subject": r.subject,
                            "stream_seq": r.stream_seq,
                            "duplicate": r.duplicate,
                        }
                    )
                progress(len(done), len(targets))
        return done

    results = _run(nats_url, work)
    if as_json:
        _print_json({"replayed": results})
    else:
        if not results:
            click.echo(f"no dead letters{_of(wk, cs)}: nothing replayed")
        for r in results:
            if "error" in r:
                click.echo(f"dead letter {r['dead_letter_seq']}: not replayed: {r['error']}")
            else:
                again = " (already stored: replayed before)" if r["duplicate"] else ""
                click.echo(
                    f"dead letter {r['dead_letter_seq']}: replayed as request {r['request_id']} "
                    f"(was {r['original_id']}) on {r['subject']}{again}"
                )
    if any("error" in r for r in results):
        sys.exit(1)


@dlq.command("drop")
@click.argument("seqs", nargs=-1, type=click.IntRange(min=1))
@_connection_options
@_json_option
@_filter_options
@click.option("--all", "everything", is_flag=True, help="Drop every dead letter (or the change set's).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def dlq_drop(
    seqs: tuple[int, ...],
    nats_url: str,
    prefix: str | None,
    as_json: bool,
    workspace: str | None,
    change_set_id: str | None,
    everything: bool,
    yes: bool,
) -> None:
    """Delete dead letters by sequence, or all of them (--all), for good.

    Asks first (--yes does not); dead letters given by sequence are checked before that: if one is missing, none
    is deleted."""
    wk, cs = _filter(workspace, change_set_id)
    if bool(seqs) == everything:
        raise click.UsageError("give dead-letter sequences, or --all")
    subjects = _subjects(prefix)
    from rebaser_client._admin_dlq import dead_letters
    from rebaser_client._admin_ops import drop_dead_letters

    async def work(nc: NatsClient) -> int:
        if everything:
            total, _ = await dead_letters(nc, subjects, workspace_id=wk, change_set_id=cs, limit=0)
            if not total:
                return 0
            # The count is what is there now: the purge removes whatever is there when it runs.
            what = f"every dead letter{_of(wk, cs)} ({total} now)"
        else:
            await _named_letters(nc, subjects, seqs)
            what = _letters_named(seqs)
        await _confirm_connected(yes, f"Delete {what} for good?")
        return await drop_dead_letters(
            nc, subjects, seqs, workspace_id=wk, change_set_id=cs, everything=everything
        )

    dropped = _run(nats_url, work)
    if as_json:
        _print_json({"dropped": dropped})
    else:
        click.echo(f"dropped {plural(dropped, 'dead letter')}")


# -- wait -------------------------------------------------------------------------------------------------------------
@click.command()
@click.argument("workspace")
@click.argument("change_set_id", metavar="CHANGE_SET")
@_connection_options
@_json_option
@click.option("--timeout", type=SECONDS, default=30.0, show_default=True, help="Seconds to wait at most.")
def wait(
    workspace: str, change_set_id: str, nats_url: str, prefix: str | None, as_json: bool, timeout: float
) -> None:
    """Return once the change set has no queued request and no DVU due (exit 1 if not within --timeout)."""
    wk, cs = _ulid(WorkspacePk, workspace, "WORKSPACE"), _ulid(ChangeSetId, change_set_id, "CHANGE_SET")
    _subjects(prefix)
    from rebaser_client._client import RebaserClient

    async def work(nc: NatsClient) -> Any:
        async with RebaserClient(nc, prefix=prefix) as client:
            answer = await client.wait_settled(wk, cs, timeout=timeout)
            if answer.applied_seq == 0 and not answer.dvu_pending and not answer.owned:
                # Settled with nothing ever processed: a change set no request reached (a mistyped id, say),
                # unless it has a record of its own (a fork).
                known = (await client.get_change_set(wk, cs)).exists
                return answer if known else None
            return answer

    answer = _run(nats_url, work)
    if answer is None:
        raise click.ClickException(
            f"nothing is known of change set {cs} in workspace {wk}: no request for it was processed, and it "
            "has no record (a mistyped id?)"
        )
    if as_json:
        _print_json(answer.model_dump(mode="json", exclude={"id", "error"}))
    else:
        stale = " (a DVU is still due, but nothing owns the change set)" if answer.dvu_pending else ""
        click.echo(f"settled: {wk}/{cs}, requests processed up to sequence {answer.applied_seq}{stale}")


ADMIN_COMMANDS: tuple[click.Command, ...] = (status, change_set, dlq, wait)
