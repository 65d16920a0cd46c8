"""``rebaser dlq list|show|replay|drop``: the dead letters (reading them is :mod:`rebaser_client.admin.dead_letters`,
replaying and dropping them :mod:`rebaser_client.admin.repairs`).

What deletes or re-sends something asks first (``--yes`` skips the question): ``dlq replay`` and ``dlq drop``. The
dead letters named are looked up before the question, so a sequence that holds none is the same one line for
``dlq show``, ``replay`` and ``drop``, and nothing is done.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from rebaser_client.admin.cli.common import (
    Audited,
    confirm_connected,
    connection_options,
    console,
    error_line,
    json_option,
    limit_option,
    parse_ulid,
    plural,
    print_json,
    progress_bar,
    run,
    subjects_of,
)
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.subjects import Subjects

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient

    from rebaser_client.admin.dead_letters import DeadLetter

__all__ = ["dlq"]


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
    return parse_ulid(WorkspacePk, workspace, "--workspace"), parse_ulid(
        ChangeSetId, change_set_id, "--change-set"
    )


def _filter_options(f: Any) -> Any:
    f = click.option("--change-set", "change_set_id", default=None, help="Only this change set's.")(f)
    f = click.option(
        "--workspace", default=None, help="Only this workspace's change set (with --change-set)."
    )(f)
    return f


@dlq.command("list")
@connection_options
@json_option
@_filter_options
@limit_option(50, "Dead letters listed (the oldest first).")
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
    subjects = subjects_of(prefix)
    from rebaser_client.admin import format as fmt
    from rebaser_client.admin.dead_letters import dead_letters

    with progress_bar("reading dead letters", enabled=not as_json) as progress:
        total, letters = run(
            nats_url,
            lambda nc: dead_letters(
                nc, subjects, workspace_id=wk, change_set_id=cs, limit=limit, progress=progress
            ),
        )
    if as_json:
        print_json(fmt.dead_letters_json(total, letters))
    else:
        console().print(fmt.dead_letters_view(total, letters, datetime.now(UTC)))


@dlq.command("show")
@click.argument("seq", type=click.IntRange(min=1))
@connection_options
@json_option
def dlq_show(seq: int, nats_url: str, prefix: str | None, as_json: bool) -> None:
    """One dead letter: why, where from, its headers and the request."""
    subjects = subjects_of(prefix)
    from rebaser_client.admin import format as fmt
    from rebaser_client.admin.dead_letters import NoDeadLetter, dead_letter

    letter = run(nats_url, lambda nc: dead_letter(nc, subjects, seq))
    if letter is None:
        raise click.ClickException(error_line(NoDeadLetter(seq)))
    if as_json:
        print_json(fmt.dead_letter_json(letter, full=True))
    else:
        console().print(fmt.dead_letter_view(letter))


def _replay_lines(results: list[dict[str, Any]]) -> list[str]:
    from rebaser_client.admin.format_actions import replay_line
    from rebaser_client.admin.repairs import ReplayResult

    return [
        f"dead letter {r['dead_letter_seq']}: not replayed: {r['error']}"
        if "error" in r
        else replay_line(ReplayResult(**r))
        for r in results
    ] or ["nothing replayed"]


def _letters_named(seqs: tuple[int, ...]) -> str:
    return f"dead letter {seqs[0]}" if len(seqs) == 1 else f"dead letters {', '.join(map(str, seqs))}"


def _of(wk: WorkspacePk | None, cs: ChangeSetId | None) -> str:
    return f" of {wk}/{cs}" if cs else ""


async def _named_letters(nc: NatsClient, subjects: Subjects, seqs: tuple[int, ...]) -> list[DeadLetter]:
    """The dead letters at ``seqs``; :class:`NoDeadLetter` for the first sequence that holds none."""
    from rebaser_client.admin.dead_letters import NoDeadLetter, dead_letter

    found: list[DeadLetter] = []
    for seq in seqs:
        letter = await dead_letter(nc, subjects, seq)
        if letter is None:
            raise NoDeadLetter(seq)
        found.append(letter)
    return found


@dlq.command("replay")
@click.argument("seqs", nargs=-1, type=click.IntRange(min=1))
@connection_options
@json_option
@_filter_options
@click.option("--all", "everything", is_flag=True, help="Replay every dead letter (or the change set's).")
@limit_option(1000, "With --all: at most this many.")
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
    subjects = subjects_of(prefix)
    from rebaser_client.admin.dead_letters import dead_letters
    from rebaser_client.admin.format_actions import replay_json
    from rebaser_client.admin.repairs import check_replayable, replay_dead_letters

    audited = Audited("replay", subjects, [f"dead letter {s}" for s in seqs], _replay_lines)

    async def work(nc: NatsClient) -> list[dict[str, Any]]:
        if everything:
            total, letters = await dead_letters(nc, subjects, workspace_id=wk, change_set_id=cs, limit=limit)
            targets = [d.seq for d in letters]
            audited.targets = [f"dead letter {s}" for s in targets]
            if not targets:
                return []
            if total > len(targets):
                click.echo(
                    f"replaying the oldest {len(targets)} of {plural(total, 'dead letter')} (--limit)",
                    err=True,
                )
            await confirm_connected(yes, f"Replay {plural(len(targets), 'dead letter')}{_of(wk, cs)}?")
        else:
            for letter in await _named_letters(nc, subjects, seqs):
                check_replayable(letter)
            targets = list(seqs)
            await confirm_connected(yes, f"Replay {_letters_named(seqs)} as new requests?")
        with progress_bar("replaying", enabled=not as_json and len(targets) > 1) as progress:
            outcomes = await replay_dead_letters(
                nc, subjects, targets, keep_going=everything, progress=progress
            )
        return [
            {"dead_letter_seq": o[0], "error": error_line(o[1])} if isinstance(o, tuple) else replay_json(o)
            for o in outcomes
        ]

    results = run(nats_url, work, audited=audited)
    from rebaser_client.admin.format_actions import replay_line
    from rebaser_client.admin.repairs import ReplayResult

    if as_json:
        print_json({"replayed": results})
    else:
        if not results:
            click.echo(f"no dead letters{_of(wk, cs)}: nothing replayed")
        for r in results:
            if "error" in r:
                click.echo(f"dead letter {r['dead_letter_seq']}: not replayed: {r['error']}")
            else:
                click.echo(replay_line(ReplayResult(**r)))
    if any("error" in r for r in results):
        sys.exit(1)


@dlq.command("drop")
@click.argument("seqs", nargs=-1, type=click.IntRange(min=1))
@connection_options
@json_option
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
    subjects = subjects_of(prefix)
    from rebaser_client.admin.dead_letters import dead_letters
    from rebaser_client.admin.repairs import drop_dead_letters

    audited = Audited(
        "drop",
        subjects,
        [f"dead letter {s}" for s in seqs] or [f"every dead letter{_of(wk, cs)}"],
        lambda dropped: [f"dropped {plural(dropped, 'dead letter')}"],
    )

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
        await confirm_connected(yes, f"Delete {what} for good?")
        return await drop_dead_letters(
            nc, subjects, seqs, workspace_id=wk, change_set_id=cs, everything=everything
        )

    dropped = run(nats_url, work, audited=audited)
    if as_json:
        print_json({"dropped": dropped})
    else:
        click.echo(f"dropped {plural(dropped, 'dead letter')}")
