"""``rebaser change-set show|purge`` and ``rebaser wait``: one change set (``change-set pause|resume|skip`` join
this group from :mod:`rebaser_client.admin.cli.pause`).

What deletes something asks first (``--yes`` skips the question): ``change-set purge`` and ``change-set
reset-record`` (which repairs an unreadable record: :mod:`rebaser_client.admin.store_repairs`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from rebaser_client.admin.cli.common import (
    Audited,
    confirm,
    connection_options,
    console,
    json_option,
    limit_option,
    parse_ulid,
    plural,
    print_json,
    progress_bar,
    run,
    subjects_of,
)
from rebaser_client.admin.cli.params import SECONDS
from rebaser_core.ids import ChangeSetId, WorkspacePk

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient

__all__ = ["change_set", "wait"]


@click.group("change-set")
def change_set() -> None:
    """Inspect, purge, pause, resume one change set, skip its first request, or reset its unreadable record."""


@change_set.command("show")
@click.argument("workspace")
@click.argument("change_set_id", metavar="CHANGE_SET")
@connection_options
@json_option
@limit_option(50, "Queued requests listed (the first in line).")
def change_set_show(
    workspace: str, change_set_id: str, nats_url: str, prefix: str | None, as_json: bool, limit: int
) -> None:
    """Queued requests (age, id, what), owner and epoch, DVU pending, the last replies."""
    wk, cs = (
        parse_ulid(WorkspacePk, workspace, "WORKSPACE"),
        parse_ulid(ChangeSetId, change_set_id, "CHANGE_SET"),
    )
    subjects = subjects_of(prefix)
    from rebaser_client.admin import format_change_set as fmt
    from rebaser_client.admin.change_set import change_set_report

    with progress_bar("reading queued requests", enabled=not as_json) as progress:
        report = run(
            nats_url, lambda nc: change_set_report(nc, subjects, wk, cs, limit=limit, progress=progress)
        )
    if report is None:
        raise click.ClickException(
            f"change set {wk}/{cs} is unknown: no record, no queued request, no task, no dead letter"
        )
    if as_json:
        print_json(fmt.change_set_json(report))
    else:
        console().print(fmt.change_set_view(report))


@change_set.command("purge")
@click.argument("workspace")
@click.argument("change_set_id", metavar="CHANGE_SET")
@connection_options
@json_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def change_set_purge(
    workspace: str, change_set_id: str, nats_url: str, prefix: str | None, as_json: bool, yes: bool
) -> None:
    """Remove every queued request of a change set (their callers get no reply). A daemon that owns the change set
    still applies the requests it has already read."""
    wk, cs = (
        parse_ulid(WorkspacePk, workspace, "WORKSPACE"),
        parse_ulid(ChangeSetId, change_set_id, "CHANGE_SET"),
    )
    subjects = subjects_of(prefix)
    from rebaser_client.admin.repairs import purge_change_set

    confirm(yes, f"Remove every queued request of change set {wk}/{cs}?")
    audited = Audited(
        "purge",
        subjects,
        [f"change set {wk}/{cs}"],
        lambda r: [f"removed {plural(r.removed, 'request')} (all stored up to sequence {r.upto_seq})"],
    )
    result = run(nats_url, lambda nc: purge_change_set(nc, subjects, wk, cs), audited=audited)
    if as_json:
        print_json({"removed": result.removed, "upto_seq": result.upto_seq, "task": result.task})
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


@change_set.command("reset-record")
@click.argument("workspace")
@click.argument("change_set_id", metavar="CHANGE_SET")
@connection_options
@json_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def change_set_reset_record(
    workspace: str, change_set_id: str, nats_url: str, prefix: str | None, as_json: bool, yes: bool
) -> None:
    """Repair a change set whose record cannot be read (a daemon quarantined it: `rebaser status` names it): delete
    the record and lift the quarantine. The change set starts over from the app's initial state, then applies its
    queued requests in order. Refused if the record reads."""
    wk, cs = (
        parse_ulid(WorkspacePk, workspace, "WORKSPACE"),
        parse_ulid(ChangeSetId, change_set_id, "CHANGE_SET"),
    )
    subjects = subjects_of(prefix)
    from rebaser_client.admin.store_repairs import reset_record

    confirm(yes, f"Delete the unreadable record of {wk}/{cs}? It starts over from the app's initial state.")
    audited = Audited(
        "reset-record",
        subjects,
        [f"change set {wk}/{cs}"],
        lambda r: [f"deleted the unreadable record of {wk}/{cs} ({r.found})"],
    )
    result = run(nats_url, lambda nc: reset_record(nc, subjects, wk, cs), audited=audited)
    resumed = result.resumed
    if as_json:
        print_json(
            {
                "found": result.found,
                "resumed": resumed is not None,
                "task_published": bool(resumed and resumed.tasks_published),
                "still_paused": None if result.still_paused is None else result.still_paused.cause,
            }
        )
        return
    click.echo(f"deleted the unreadable record of {wk}/{cs} ({result.found})")
    if result.still_paused is not None:
        click.echo(
            f"note: still paused by {result.still_paused.cause}; `rebaser change-set resume {wk} {cs}` lets it go on"
        )
    elif resumed is not None and resumed.queued:
        click.echo("resumed: its queued requests are applied from the app's initial state")
    else:
        click.echo("resumed: nothing queued")


# -- wait -------------------------------------------------------------------------------------------------------------
@click.command()
@click.argument("workspace")
@click.argument("change_set_id", metavar="CHANGE_SET")
@connection_options
@json_option
@click.option("--timeout", type=SECONDS, default=30.0, show_default=True, help="Seconds to wait at most.")
def wait(
    workspace: str, change_set_id: str, nats_url: str, prefix: str | None, as_json: bool, timeout: float
) -> None:
    """Return once the change set has no queued request and no DVU due (exit 1 if not within --timeout)."""
    wk, cs = (
        parse_ulid(WorkspacePk, workspace, "WORKSPACE"),
        parse_ulid(ChangeSetId, change_set_id, "CHANGE_SET"),
    )
    subjects_of(prefix)
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

    answer = run(nats_url, work)
    if answer is None:
        raise click.ClickException(
            f"nothing is known of change set {cs} in workspace {wk}: no request for it was processed, and it "
            "has no record (a mistyped id?)"
        )
    if as_json:
        print_json(answer.model_dump(mode="json", exclude={"id", "error"}))
    else:
        stale = " (a DVU is still due, but nothing owns the change set)" if answer.dvu_pending else ""
        click.echo(f"settled: {wk}/{cs}, requests processed up to sequence {answer.applied_seq}{stale}")
