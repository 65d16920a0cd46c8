"""``rebaser audit``: the operators' audit trail, newest first (every action of the web console and of the
``rebaser`` commands: :mod:`rebaser_client.admin.audit`)."""

from __future__ import annotations

from typing import Any

import click

from rebaser_client.admin.cli.common import (
    connection_options,
    console,
    json_option,
    limit_option,
    print_json,
    run,
    subjects_of,
)

__all__ = ["audit"]


@click.command("audit")
@connection_options
@json_option
@limit_option(20, "Entries shown at most (the newest).")
def audit(nats_url: str, prefix: str | None, as_json: bool, limit: int) -> None:
    """List the newest entries of the audit trail: when, who (the console's token identity or `local`, the OS user
    of a command), where from, what, which targets, the outcome and what the operator was told."""
    subjects = subjects_of(prefix)
    from rebaser_client.admin.audit import entries

    total, found = run(nats_url, lambda nc: entries(nc, subjects, limit=limit))
    if as_json:
        print_json({"total": total, "entries": found})
        return
    if not found:
        click.echo("no audit entries" if not total else f"{total} audit entries (--limit 0 shows none)")
        return
    from rich.table import Table

    table = Table(title=f"audit trail: the newest {len(found)} of {total}")
    for column in ("at", "who", "from", "what", "targets", "outcome", "said"):
        table.add_column(column, overflow="fold")
    for e in found:
        table.add_row(
            str(e.get("at", "")),
            str(e.get("who", "")),
            str(e.get("source", "")),
            str(e.get("what", "")),
            _joined(e.get("targets")),
            str(e.get("outcome", "")),
            _joined(e.get("lines")),
        )
    console().print(table)


def _joined(items: Any) -> str:
    return "\n".join(str(i) for i in items) if isinstance(items, list) else ""
