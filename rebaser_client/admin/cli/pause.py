"""``rebaser change-set pause|resume|skip`` and ``rebaser workspace pause|resume``: holding work back.

A paused change set is let go by its owner at its next request boundary and taken by no daemon until it is
resumed; its requests are still accepted and stored. ``skip`` moves a paused change set's first request to the dead
letters (asks first; ``--yes`` does not). The library does the work (:mod:`rebaser_client._pausing`,
:mod:`rebaser_client._skipping`: ``RebaserClient`` offers the same operations); this module parses options and
prints, as the other commands do (:mod:`~rebaser_client.admin.cli.common`). Its ``change-set`` commands join
:mod:`~rebaser_client.admin.cli.change_set`'s group (:func:`register`).

nats-py, pydantic and rich are imported by the commands, once their options are checked.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from rebaser_client.admin.cli.change_set import change_set
from rebaser_client.admin.cli.common import (
    Audited,
    confirm_connected,
    connection_options,
    json_option,
    parse_ulid,
    print_json,
    run,
    subjects_of,
)
from rebaser_client.admin.cli.params import SECONDS
from rebaser_client.admin.format_actions import (
    pause_json,
    pause_line,
    resume_json,
    resume_lines,
    skip_json,
    skip_line,
    target_name,
)
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.subjects import Subjects

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient

    from rebaser_client._pausing import PauseResult, ResumeResult
    from rebaser_client._skipping import SkipResult

__all__ = [
    "pause_json",
    "pause_line",
    "register",
    "resume_json",
    "resume_lines",
    "skip_json",
    "skip_line",
    "workspace",
]


def _ids(workspace_id: str, change_set_id: str) -> tuple[WorkspacePk, ChangeSetId]:
    return parse_ulid(WorkspacePk, workspace_id, "WORKSPACE"), parse_ulid(
        ChangeSetId, change_set_id, "CHANGE_SET"
    )


def _wait_options(f: Any) -> Any:
    f = click.option(
        "--timeout",
        type=SECONDS,
        default=30.0,
        show_default=True,
        help="With --wait: seconds to wait at most (exit 1 if a daemon still holds it then; it stays paused).",
    )(f)
    f = click.option(
        "--wait/--no-wait",
        default=True,
        show_default=True,
        help="Return only once no daemon holds it any more (its owner lets it go at its next request boundary).",
    )(f)
    f = click.option("--reason", default="", help="Why (shown by `status` and `change-set show`).")(f)
    return f


def _now() -> datetime:
    return datetime.now(UTC)


def _audited(what: str, subjects: Subjects, target: str, lines: Callable[[Any], list[str]]) -> Audited:
    return Audited(what, subjects, [target], lines)


# -- change-set pause | resume | skip --------------------------------------------------------------------------------
@click.command("pause")
@click.argument("workspace_id", metavar="WORKSPACE")
@click.argument("change_set_id", metavar="CHANGE_SET")
@_wait_options
@connection_options
@json_option
def change_set_pause(
    workspace_id: str,
    change_set_id: str,
    reason: str,
    wait: bool,
    timeout: float,
    nats_url: str,
    prefix: str | None,
    as_json: bool,
) -> None:
    """Pause a change set: its owner lets it go at the next request boundary, no daemon takes it until it is
    resumed; its requests are still accepted and stored. Pausing a paused change set keeps the first pause."""
    wk, cs = _ids(workspace_id, change_set_id)
    subjects = subjects_of(prefix)
    from rebaser_client._pausing import pause_change_set
    from rebaser_client.admin.audit import cli_identity

    result = run(
        nats_url,
        lambda nc: pause_change_set(
            nc, subjects, wk, cs, reason, wait=timeout if wait else None, by=cli_identity()
        ),
        audited=_audited("pause", subjects, target_name(str(wk), str(cs)), lambda r: [pause_line(r, _now())]),
    )
    _show_pause(result, as_json)


@click.command("resume")
@click.argument("workspace_id", metavar="WORKSPACE")
@click.argument("change_set_id", metavar="CHANGE_SET")
@connection_options
@json_option
def change_set_resume(
    workspace_id: str, change_set_id: str, nats_url: str, prefix: str | None, as_json: bool
) -> None:
    """Resume a paused change set: remove its pause and give it a task if requests are queued (not paused: nothing
    to remove, the task all the same)."""
    wk, cs = _ids(workspace_id, change_set_id)
    subjects = subjects_of(prefix)
    from rebaser_client._pausing import resume_change_set

    result = run(
        nats_url,
        lambda nc: resume_change_set(nc, subjects, wk, cs),
        audited=_audited(
            "resume", subjects, target_name(str(wk), str(cs)), lambda r: resume_lines(r, _now())
        ),
    )
    _show_resume(result, as_json)


@click.command("skip")
@click.argument("workspace_id", metavar="WORKSPACE")
@click.argument("change_set_id", metavar="CHANGE_SET")
@click.argument("request_id", metavar="REQUEST_ID")
@connection_options
@json_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def change_set_skip(
    workspace_id: str,
    change_set_id: str,
    request_id: str,
    nats_url: str,
    prefix: str | None,
    as_json: bool,
    yes: bool,
) -> None:
    """Move a paused change set's first queued request, REQUEST_ID, to the dead letters (reason "skipped by an
    operator"; `rebaser dlq replay` can send it again). Refused unless the change set is paused and REQUEST_ID is
    first in line. Asks first (--yes does not)."""
    wk, cs = _ids(workspace_id, change_set_id)
    rid = parse_ulid(RequestId, request_id, "REQUEST_ID")
    subjects = subjects_of(prefix)
    from rebaser_client._skipping import check_skip, skip_request

    async def work(nc: NatsClient) -> SkipResult:
        target = await check_skip(nc, subjects, wk, cs, rid)  # refused before the question, as `dlq drop` is
        await confirm_connected(
            yes,
            f"Move request {target.request_id} (seq {target.seq}), first in line of {wk}/{cs}, to the dead letters?",
        )
        return await skip_request(nc, subjects, wk, cs, rid)

    audited = _audited("skip", subjects, f"{wk}/{cs} request {rid}", lambda r: [skip_line(r)])
    result = run(nats_url, work, audited=audited)
    if as_json:
        print_json(skip_json(result))
    else:
        click.echo(skip_line(result))


# -- workspace pause | resume -----------------------------------------------------------------------------------------
@click.group("workspace")
def workspace() -> None:
    """Pause or resume every change set of a workspace."""


@workspace.command("pause")
@click.argument("workspace_id", metavar="WORKSPACE")
@_wait_options
@connection_options
@json_option
def workspace_pause(
    workspace_id: str,
    reason: str,
    wait: bool,
    timeout: float,
    nats_url: str,
    prefix: str | None,
    as_json: bool,
) -> None:
    """Pause every change set of a workspace, those created later too (each is let go at its next request
    boundary; requests are still accepted and stored). A change set's own pause is independent of it."""
    wk = parse_ulid(WorkspacePk, workspace_id, "WORKSPACE")
    subjects = subjects_of(prefix)
    from rebaser_client._pausing import pause_workspace
    from rebaser_client.admin.audit import cli_identity

    result = run(
        nats_url,
        lambda nc: pause_workspace(
            nc, subjects, wk, reason, wait=timeout if wait else None, by=cli_identity()
        ),
        audited=_audited("pause", subjects, target_name(str(wk), None), lambda r: [pause_line(r, _now())]),
    )
    _show_pause(result, as_json)


@workspace.command("resume")
@click.argument("workspace_id", metavar="WORKSPACE")
@connection_options
@json_option
def workspace_resume(workspace_id: str, nats_url: str, prefix: str | None, as_json: bool) -> None:
    """Resume a workspace: remove its pause and give a task to each of its change sets with requests queued
    (change sets paused on their own stay paused)."""
    wk = parse_ulid(WorkspacePk, workspace_id, "WORKSPACE")
    subjects = subjects_of(prefix)
    from rebaser_client._pausing import resume_workspace

    result = run(
        nats_url,
        lambda nc: resume_workspace(nc, subjects, wk),
        audited=_audited("resume", subjects, target_name(str(wk), None), lambda r: resume_lines(r, _now())),
    )
    _show_resume(result, as_json)


def _show_pause(result: PauseResult, as_json: bool) -> None:
    now = _now()
    if as_json:
        print_json(pause_json(result, now))
    else:
        click.echo(pause_line(result, now))


def _show_resume(result: ResumeResult, as_json: bool) -> None:
    now = _now()
    if as_json:
        print_json(resume_json(result, now))
    else:
        click.echo("\n".join(resume_lines(result, now)))


def register(main: click.Group) -> None:
    """Add ``pause``, ``resume`` and ``skip`` to the ``change-set`` group and ``workspace`` to ``main``."""
    for command in (change_set_pause, change_set_resume, change_set_skip):
        change_set.add_command(command)
    main.add_command(workspace)
