"""The pieces every console page is made of: the page around the content, escaping, ages, state badges and the
action buttons. Pure: strings in, strings out.

Everything shown comes from the deployment (ids, reasons, app error texts), so every value goes through
:func:`esc`; the pages build no HTML from anything else. An action button carries what the action needs as JSON in
``data-body``; ``console.js`` asks the console what it would do, asks the operator, then sends it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import urlencode

__all__ = [
    "action_button",
    "age_cell",
    "badges",
    "esc",
    "link",
    "page",
    "table",
    "when",
]

_NAV = (
    ("overview", "/", "Overview"),
    ("change-sets", "/change-sets", "Change sets"),
    ("dead-letters", "/dead-letters", "Dead letters"),
    ("audit", "/audit", "Audit"),
)


def esc(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def link(href: str, text: object, query: Mapping[str, str] | None = None) -> str:
    if query:
        href = f"{href}?{urlencode(query)}"
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def when(at: float | None) -> str:
    """A wall-clock time, UTC, to the millisecond (``-`` if unknown)."""
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def age_cell(at: float | None) -> str:
    """An age that ``console.js`` keeps counting in the browser (no message from the console every second)."""
    if at is None:
        return '<td class="age">-</td>'
    return f'<td class="age" data-since="{at:.3f}" title="{esc(when(at))}"></td>'


def badges(states: Iterable[str]) -> str:
    return (
        "".join(f'<span class="badge {esc(s)}">{esc(s)}</span>' for s in states)
        or '<span class="badge idle">idle</span>'
    )


def action_button(action: str, label: str, body: Mapping[str, Any], *, danger: bool = False) -> str:
    """A button that asks, then runs ``action`` with ``body`` (see console.js)."""
    kind = " danger" if danger else ""
    data = esc(json.dumps(body, separators=(",", ":")))
    return (
        f'<button type="button" class="act{kind}" data-action="{esc(action)}" data-body="{data}">'
        f"{esc(label)}</button>"
    )


def table(headers: Iterable[str], rows: Iterable[str], *, table_id: str = "", empty: str = "none") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(rows)
    if not body:
        body = f'<tr class="empty"><td colspan="99">{esc(empty)}</td></tr>'
    ident = f' id="{esc(table_id)}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def page(
    *,
    title: str,
    section: str,
    body: str,
    csrf: str,
    stream: str,
    read_only: bool,
    problem: str | None,
    banner: str | None = None,
    stale_since: float | None = None,
) -> str:
    """A whole page: the navigation, the search box, what went wrong lately, ``body``, the confirmation dialog and
    the outcome area. ``stream``: the server-sent-events URL that keeps it live."""
    nav = "".join(
        f'<a href="{href}" class="{"on" if key == section else ""}">{text}</a>' for key, href, text in _NAV
    )
    mode = '<span class="mode">read-only</span>' if read_only else ""
    live_title = "live updates" if stale_since is None else f"stale, not live: as of {when(stale_since)}"
    live_class = "live" if stale_since is None and not problem else "live stale"
    # The console's reads failing: said at the top of every page (console.js keeps it up to date), and the live dot
    # turns amber: what the page shows is as of the last read that succeeded, not live.
    notes = f'<p class="problem" id="problem"{"" if problem else " hidden"}>{esc(problem or "")}</p>'
    if banner:
        notes += f'<p class="banner" id="banner">{esc(banner)}</p>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)} · rebaser console</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="csrf" content="{esc(csrf)}">
<link rel="stylesheet" href="/static/console.css"><script src="/static/console.js" defer></script></head>
<body data-stream="{esc(stream)}" data-read-only="{"1" if read_only else "0"}">
<header><strong>rebaser console</strong><nav>{nav}</nav>
<form action="/find" method="get" class="find">
<input name="id" placeholder="find a change set or workspace id" size="30"><button>Find</button></form>
{mode}<span id="live" class="{live_class}" title="{esc(live_title)}">●</span></header>
{notes}<main>{body}</main>
<dialog id="confirm"><form method="dialog"><p class="question"></p><ul class="targets"></ul>
<menu><button value="yes" class="yes">Yes, do it</button> <button value="no">Cancel</button></menu></form></dialog>
<div id="outcome" role="status" hidden></div>
</body></html>
"""
