"""The parts of a page that are read from NATS when shown (a change set's details, a list of dead letters), for a
page and for its live updates alike. Each read is shared by the browsers that ask for the same thing meanwhile
(:meth:`~rebaser_client.admin.console.live.Live.shared`).
"""

from __future__ import annotations

from collections.abc import Mapping

from rebaser_client.admin.change_set import change_set_report
from rebaser_client.admin.console.html import esc
from rebaser_client.admin.console.live import Live
from rebaser_client.admin.console.pages_detail import change_set_detail, dead_letters_body, dead_letters_part
from rebaser_client.admin.dead_letters import dead_letters
from rebaser_core.errors import RebaserError
from rebaser_core.ids import ChangeSetId, WorkspacePk

__all__ = ["DEAD_LETTERS_LISTED", "detail_html", "letters_filter", "letters_html"]

DEAD_LETTERS_LISTED = 200


def _problem(err: RebaserError) -> str:
    return f'<p class="problem">{esc(type(err).__name__)}: {esc(err)}</p>'


async def detail_html(
    live: Live, wk: WorkspacePk, cs: ChangeSetId, *, read_only: bool, newer_than: float = 0.0
) -> str:
    try:
        report = await live.shared(
            ("cs", wk, cs),
            lambda: change_set_report(live.nc, live.subjects, wk, cs, limit=50),
            newer_than=newer_than,
        )
    except RebaserError as err:
        return _problem(err)
    row = live.row_of(str(wk), str(cs))
    states = live.index.states(row) if row is not None else ()
    return change_set_detail(str(wk), str(cs), report, row, states, read_only=read_only)


def letters_filter(query: Mapping[str, str]) -> dict[str, str]:
    """The dead-letter list's filter from a query string: ``workspace`` and ``change_set`` (with a workspace)."""
    return {k: query[k].strip() for k in ("workspace", "change_set") if query.get(k, "").strip()}


async def letters_html(
    live: Live, query: Mapping[str, str], *, read_only: bool, newer_than: float = 0.0, part: bool = False
) -> str:
    """The dead letters page's body, or (``part``) its live part: the count, the bulk buttons and the list."""
    try:
        wk = WorkspacePk(query["workspace"]) if "workspace" in query else None
        cs = ChangeSetId(query["change_set"]) if "change_set" in query and wk is not None else None
    except ValueError:
        return '<p class="problem">not a workspace or change set id (ULIDs)</p>'
    try:
        total, found = await live.shared(
            ("dlq", wk, cs),
            lambda: dead_letters(
                live.nc, live.subjects, workspace_id=wk, change_set_id=cs, limit=DEAD_LETTERS_LISTED
            ),
            newer_than=newer_than,
        )
    except RebaserError as err:
        return _problem(err)
    render = dead_letters_part if part else dead_letters_body
    return render(total, found, dict(query), read_only=read_only)
