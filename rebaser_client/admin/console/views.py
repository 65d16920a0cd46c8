"""The parts of a page that are read from NATS when shown (a change set's details, a list of dead letters), for a
page and for its live updates alike. Each read is shared by the browsers that ask for the same thing meanwhile
(:meth:`~rebaser_client.admin.console.live.Live.shared`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from rebaser_client._queries import Queries
from rebaser_client.admin.change_set import change_set_report
from rebaser_client.admin.console.html import esc
from rebaser_client.admin.console.live import Live
from rebaser_client.admin.console.pages_detail import change_set_detail, dead_letters_body, dead_letters_part
from rebaser_client.admin.dead_letters import dead_letters
from rebaser_core.api import GET_CHANGE_SET_REQUEST, GET_CHANGE_SET_RESPONSE, GetChangeSetRequest
from rebaser_core.api.codec import ContentType
from rebaser_core.errors import RebaserError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk

__all__ = [
    "DEAD_LETTERS_LISTED",
    "VALUES_LISTED",
    "detail_html",
    "letters_filter",
    "letters_html",
    "values_html",
]

DEAD_LETTERS_LISTED = 200
VALUES_LISTED = 500  # a change set's values shown at most (the rest are counted)
_VALUE_CHARS = 500  # one value's JSON, cut to
_VALUES_TIMEOUT = 3.0


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


async def values_html(live: Live, wk: WorkspacePk, cs: ChangeSetId) -> str:
    """A change set's committed values, through the app's own view: the ``get`` query the daemons answer with the
    app's ``describe()`` (the snapshot app's paths and values, with their versions and errors). An app without a
    view says so; no daemon answering, or a change set not there, says that."""
    request = GetChangeSetRequest(id=RequestId.new(), workspace_id=wk, change_set_id=cs)
    queries = Queries(live.nc, live.subjects, ContentType.CBOR)

    async def ask() -> object:
        return await queries.ask(
            "get", request, GET_CHANGE_SET_REQUEST, GET_CHANGE_SET_RESPONSE, _VALUES_TIMEOUT
        )

    try:
        response: object = await live.shared(("values", str(wk), str(cs)), ask)
    except RebaserError as err:
        return f'<section id="values">{_problem(err)}</section>'
    error = getattr(response, "error", None)
    if error:
        if "cannot describe" in error:
            note = f"the app has no view of its values: {error}"
            return f'<section id="values"><p class="empty" id="no-view">{esc(note)}</p></section>'
        return f'<section id="values"><p class="problem">{esc(error)}</p></section>'
    if not getattr(response, "exists", False):
        return '<section id="values"><p class="empty">no record yet: nothing applied to this change set</p></section>'
    values: Mapping[str, object] = getattr(response, "values", {}) or {}
    versions: Mapping[str, str] = getattr(response, "versions", {}) or {}
    errors: Mapping[str, str] = getattr(response, "errors", {}) or {}
    paths = sorted(set(values) | set(errors))
    rows = []
    for path in paths[:VALUES_LISTED]:
        shown = json.dumps(values.get(path), ensure_ascii=False, default=str)
        if len(shown) > _VALUE_CHARS:
            shown = shown[:_VALUE_CHARS] + "…"
        cell = (
            f'<span class="error">{esc(errors[path])}</span>'
            if path in errors
            else f"<code>{esc(shown)}</code>"
        )
        rows.append(
            f"<tr><td><code>{esc(path)}</code></td><td>{cell}</td><td>{esc(versions.get(path, ''))}</td></tr>"
        )
    more = (
        f'<p class="summary">and {len(paths) - VALUES_LISTED} more (rebaser_client: get_change_set)</p>'
        if len(paths) > VALUES_LISTED
        else ""
    )
    facts = []
    snapshot = getattr(response, "snapshot_address", None)
    if snapshot:
        facts.append(f"snapshot <code>{esc(snapshot)}</code>")
    if getattr(response, "dvu_pending", False):
        facts.append("DVU pending: derived values may change")
    head = f'<p class="summary">{"; ".join(facts)}</p>' if facts else ""
    body = (
        '<table id="values-table"><thead><tr><th>path</th><th>value</th><th>version</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="empty">no values</p>'
    )
    return f'<section id="values">{head}{body}{more}</section>'
