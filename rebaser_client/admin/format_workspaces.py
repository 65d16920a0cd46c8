"""The busiest workspaces of ``rebaser status`` as JSON-able data and as a rich table. Pure: no NATS, no I/O."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from rebaser_client.admin.workspaces import DaemonsOwned, WorkspaceLine

__all__ = ["workspaces_json", "workspaces_view"]


def workspaces_json(lines: tuple[WorkspaceLine, ...], total: int, daemons: DaemonsOwned) -> dict[str, Any]:
    return {
        "workspaces_total": total,
        "workspaces": [
            {
                "workspace_id": w.workspace_id,
                "owned": w.owned,  # null: no daemon read
                "waiting": w.waiting,
                "tasks": w.tasks,
                "queued": w.queued,
                "served": None
                if w.served is None
                else round(w.served, 4),  # its part of the tasks taken lately
            }
            for w in lines
        ],
        "daemons_read": daemons.read,
        "daemon_problems": list(daemons.problems),
    }


def workspaces_view(lines: tuple[WorkspaceLine, ...], total: int, daemons: DaemonsOwned) -> RenderableType:
    # Owned and waiting come from the daemons' /status: without one read, the columns are left out (not shown as
    # "?"), and the line under the table says how to have them.
    read = Text(
        f"  owned: as {daemons.read} daemons read say"
        if daemons.known
        else "  owned and waiting not shown: they come from the daemons; give --daemon-url to read them"
    )
    problems = [Text(f"  {problem}", style="yellow") for problem in daemons.problems]
    if not lines:
        return Group(Text("workspaces with work: none"), *problems)
    table = Table(
        title=f"workspaces with work: {total}"
        + (f" (the {len(lines)} busiest listed)" if len(lines) < total else ""),
        title_justify="left",
    )
    columns = ("workspace", "owned", "waiting") if daemons.known else ("workspace",)
    shares = daemons.served_total > 0  # the share served: of the tasks the daemons read took lately
    for column in (*columns, "change sets with a task", "queued", *(("served",) if shares else ())):
        table.add_column(column, justify="left" if column == "workspace" else "right")
    for w in lines:
        owned: tuple[str, ...] = ()
        if daemons.known:
            owned = ("?" if w.owned is None else str(w.owned), "?" if w.waiting is None else str(w.waiting))
        served = (f"{100 * (w.served or 0):.0f} %",) if shares else ()
        table.add_row(w.workspace_id, *owned, str(w.tasks), str(w.queued), *served)
    return Group(table, read, *problems)
