"""The overview and the change-set list, as HTML (the content of :func:`~rebaser_client.admin.console.html.page`).
Pure: they render what :mod:`~rebaser_client.admin.console.live` knows (the index, ``rebaser status``'s report).

A list row is :func:`row_data` alone, for the page and for the live updates alike; console.js draws it (the rows on
screen only).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from rebaser_client.admin.console.html import action_button, esc, link, table, when
from rebaser_client.admin.console.index import STATES, Filter, Index, Row
from rebaser_client.admin.console.live import Live, Sample
from rebaser_client.admin.format import shorten
from rebaser_client.admin.status import Counts, StatusReport
from rebaser_client.admin.workspaces import DaemonLine, DaemonsOwned
from rebaser_core.pauses import repair_command

__all__ = [
    "audit_body",
    "change_sets_body",
    "json_script",
    "list_counts",
    "live_overview",
    "overview_body",
    "row_data",
    "stale_note",
]


# -- the change-set list ---------------------------------------------------------------------------------------------
def row_data(row: Row, states: Sequence[str]) -> list[Any]:
    """One row of the list as console.js draws it: [workspace, change set, states, owner, queued, oldest request's
    time (Unix seconds or null), dead letters, held]. ``held``: a daemon holds its task now, so ``owner`` is its
    owner; otherwise ``owner`` is only the daemon that held it last (its record), shown as such. The page carries
    them all as JSON and the browser lays out only the rows on screen, so a list of tens of thousands draws as fast
    as a short one; a live update sends the same."""
    return [
        row.workspace_id,
        row.change_set_id,
        list(states),
        row.owner,
        row.queued,
        None if row.oldest_at is None else round(row.oldest_at, 3),
        row.dead_letters,
        row.task == "owned",
    ]


def list_counts(index: Index) -> dict[str, int]:
    """The state drop-down's counts (every state's, and ``""``: every change set), sent with each live update of
    the list so that they stay those of the rows shown."""
    return {"": len(index.rows), **index.state_counts()}


def json_script(element_id: str, data: Any) -> str:
    """``data`` as a JSON data block (never run); ``<``, ``>`` and ``&`` escaped, so no value can close it."""
    text = json.dumps(data, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/json" id="{esc(element_id)}">{text}</script>'


def change_sets_body(index: Index, flt: Filter, *, read_only: bool, loaded: bool) -> str:
    rows = list(index.matching(flt))
    counts = index.state_counts()
    options = "".join(
        f'<option value="{s}"{" selected" if flt.state == s else ""}>{s} ({counts[s]})</option>'
        for s in STATES
    )
    workspaces = sorted({r.workspace_id for r in index.rows.values()})
    datalist = "".join(f'<option value="{esc(w)}">' for w in workspaces[:1000])
    form = (
        '<form method="get" action="/change-sets" class="filter" id="filter">'
        f'<label>workspace <input name="workspace" list="workspaces" size="30" value="{esc(flt.workspace_id or "")}">'
        f'</label><datalist id="workspaces">{datalist}</datalist>'
        f'<label>state <select name="state"><option value="">any ({len(index.rows)})</option>{options}</select></label>'
        '<button type="submit">Filter</button> <a href="/change-sets">clear</a></form>'
    )
    bulk = ""
    if not read_only:
        where = {"filter": flt.query()}
        bulk = (
            '<div class="bulk">On this filter: '
            + action_button("pause", "Pause every change set listed", where)
            + action_button("resume", "Resume every change set listed", where)
        )
        if flt.workspace_id:
            ws = {"targets": [{"workspace_id": flt.workspace_id, "change_set_id": None}]}
            bulk += action_button("pause", "Pause the workspace", ws) + action_button(
                "resume", "Resume the workspace", ws
            )
        bulk += "</div>"
    listing = table(
        ("change set", "workspace", "state", "owner", "queued", "oldest request", "dead letters", ""),
        (),
        table_id="rows",
        empty="no change set matches" if loaded else "reading the change sets…",
    ) + json_script("rows-data", [row_data(r, index.states(r)) for r in rows])
    summary = (
        f'<p class="summary"><span id="shown">{len(rows)}</span> of <span id="total">{len(index.rows)}</span> '
        f"change sets ({esc(flt.describe())})</p>"
    )
    return f'<h1>Change sets</h1>{form}{bulk}{summary}<div id="list">{listing}</div>'


# -- the overview ----------------------------------------------------------------------------------------------------
def _health(d: DaemonLine) -> str:
    if d.ready:
        return "ready"
    if d.ready is False:
        return "not ready: " + ", ".join(d.not_ready)
    return d.problem or "?"


def _daemons(report: StatusReport, index: Index, daemons: DaemonsOwned | None) -> str:
    lines = (daemons or report.daemons).daemons
    if lines:
        rows = [
            "<tr>"
            f"<td>{esc(d.owner or '-')}</td><td>{esc(d.url)}</td>"
            f"<td>{esc(_health(d))}</td>"
            f"<td>{esc(d.lease_mode or '-')}</td><td>{esc(', '.join(map(str, d.served_shards)) or '-')}</td>"
            f"<td class=n>{'-' if d.owned is None else d.owned}/{'-' if d.concurrency is None else d.concurrency}</td>"
            f"<td>{esc(d.durability or '-')}</td></tr>"
            for d in lines
        ]
        return table(
            ("daemon", "health endpoint", "health", "lease mode", "shards", "owned", "durability"), rows
        )
    owners = sorted({r.owner for r in index.rows.values() if r.task == "owned" and r.owner})
    heard = f"Daemons holding change sets now (their records): {esc(', '.join(owners) or 'none')}."
    beats = "" if report.heartbeats is None else f" Heartbeats (lease mode daemon): {report.heartbeats}."
    return (
        f"<p>{heard}{beats} Give <code>rebaser console --daemon-url http://HOST:9464</code> (once per daemon) to see "
        "each daemon's health, shards, lease mode and durability here.</p>"
    )


def _shards(counts: Counts | None) -> str:
    if counts is None:
        return ""
    summaries = counts.summaries
    rows = []
    for i, shard in enumerate(counts.shards):
        requests, tasks = summaries[2 * i], summaries[2 * i + 1]
        upto = counts.upto.get(shard)
        rows.append(
            f"<tr><td class=n>{shard}</td><td>{esc(requests.name)}</td><td class=n>{requests.messages or 0}</td>"
            f"<td class=n>{tasks.messages or 0}</td><td class=n>{'-' if upto is None else upto}</td></tr>"
        )
    layout = counts.layout
    title = "one" if layout is None else f"{layout.streams} ({layout.mode}, intake {layout.intake})"
    return f"<h2>Shards: {esc(title)}</h2>" + table(
        ("shard", "requests stream", "requests", "tasks", "tasks delivered up to"), rows
    )


def _workspaces(report: StatusReport) -> str:
    def share(v: float | None) -> str:
        return "-" if v is None else f"{v:.0%}"

    rows = (
        f"<tr><td>{link('/change-sets', w.workspace_id, {'workspace': w.workspace_id})}</td><td class=n>{w.queued}</td>"
        f"<td class=n>{w.tasks}</td><td class=n>{'-' if w.owned is None else w.owned}</td>"
        f"<td class=n>{'-' if w.waiting is None else w.waiting}</td><td class=n>{share(w.served)}</td></tr>"
        for w in report.workspaces
    )
    return f"<h2>Workspaces: {report.workspaces_total}</h2>" + table(
        (
            "workspace",
            "requests queued",
            "change sets with a task",
            "owned",
            "waiting",
            "share served lately",
        ),
        rows,
        empty="no workspace has work queued",
    )


def stale_note(stale_since: float | None) -> str:
    """What a page says while the console's NATS reads fail: what it shows is as of the last one that succeeded
    (its age counts up in the browser); nothing while they succeed."""
    if stale_since is None:
        return ""
    return (
        '<p class="stale" id="stale">Stale: the console cannot read NATS. The states, counts and change sets '
        f'shown are as of {esc(when(stale_since))}, <span data-since="{stale_since:.3f}"></span> ago, not live; '
        "the daemons' health (with --daemon-url) is read on its own and is current.</p>"
    )


def live_overview(live: Live, report: StatusReport | None) -> str:
    """The overview of ``report`` with everything else as the console's live state has it now (the page and its live
    updates draw the same)."""
    return overview_body(
        report,
        live.counts,
        live.index,
        live.feed_on,
        daemons=live.daemons,
        stale_since=live.health()["stale_since"],
        samples=live.samples,
    )


def overview_body(
    report: StatusReport | None,
    counts: Counts | None,
    index: Index,
    feed_on: bool | None,
    *,
    daemons: DaemonsOwned | None = None,
    stale_since: float | None = None,
    samples: Sequence[Sample] = (),
) -> str:
    """The overview. ``daemons``: the daemons' health read on its own (current even while NATS fails);
    ``stale_since``: while the NATS reads fail, when the last one succeeded (the rest is shown as of then);
    ``samples``: what the charts draw (the console's refreshes, oldest first)."""
    states = index.state_counts()
    totals = "".join(
        f'<a class="tile" href="/change-sets?state={s}"><b>{states[s]}</b>{s}</a>' for s in STATES
    )
    tiles = f'<div class="tiles{" stale" if stale_since is not None else ""}">{totals}</div>'
    if report is None:
        return f"<h1>Overview</h1>{stale_note(stale_since)}{tiles}<p>reading the deployment…</p>"
    dlq = report.streams[-1] if report.streams else None  # read_counts lists the dead letters' stream last
    queued = sum(s.messages or 0 for s in report.streams[:-1][::2])  # each shard's requests, then its tasks
    facts: Iterable[tuple[str, object]] = (
        ("change sets known", len(index.rows)),
        ("records", "-" if report.records is None else report.records),
        ("requests in the streams", queued),
        ("dead letters", 0 if dlq is None else dlq.messages or 0),
        ("pauses", f"{report.pauses_total}{'+' if report.pauses_more else ''}"),
        ("event feed", "on" if feed_on else "off" if feed_on is False else "?"),
    )
    durability = report.durability
    dur = "unknown"
    if durability is not None:
        dur = f"{durability.level} (sync {durability.sync}, replicas {durability.min_replicas})"
        if report.durability_from:
            dur += f", as the daemon {report.durability_from} found it"
    facts_html = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts)
    return (
        f"<h1>Overview</h1>{stale_note(stale_since)}{tiles}"
        f'<table class="facts">{facts_html}<tr><th>durability</th><td>{esc(dur)}</td></tr></table>'
        f"{_charts(samples)}"
        f"{_repairs(report)}<h2>Daemons</h2>{_daemons(report, index, daemons)}{_shards(counts)}"
        f"{_workspaces(report)}"
    )


_CHARTS = (
    ("backlog", "backlog", "requests queued"),
    ("rate", "applied / s", "requests applied per second"),
    ("dead", "dead letters", "dead letters kept"),
    ("owned", "owned", "change sets a daemon holds"),
)


def _charts(samples: Sequence[Sample]) -> str:
    """The charts over the last minutes: the samples as JSON (columns), drawn as SVG by console.js."""
    data = {
        "at": [round(s.at, 3) for s in samples],
        "backlog": [s.backlog for s in samples],
        "rate": [None if s.applied_per_s is None else round(s.applied_per_s, 2) for s in samples],
        "dead": [s.dead_letters for s in samples],
        "owned": [s.owned for s in samples],
    }
    exact = not samples or samples[-1].exact
    rate_note = "" if exact else " (the event feed is off: requests taken off the queues, dead-lettered too)"
    figures = "".join(
        f'<figure class="chart" data-key="{key}">'
        f'<figcaption title="{esc(title + (rate_note if key == "rate" else ""))}">'
        f'{esc(name)} <span class="now"></span></figcaption></figure>'
        for key, name, title in _CHARTS
    )
    payload = esc(json.dumps(data, separators=(",", ":")))
    return f'<h2>Over time</h2><div id="charts" data-samples="{payload}">{figures}</div>'


def _repairs(report: StatusReport) -> str:
    """The paused change sets whose pause stands for damage (an unreadable record, an unreadable pause entry), each
    with the command that repairs it; nothing if there is none."""
    rows = []
    for line in report.pauses:
        fix = repair_command(line.pause, line.workspace_id, line.change_set_id)
        if fix is not None:
            what = (
                line.workspace_id
                if line.change_set_id is None
                else f"{line.workspace_id}/{line.change_set_id}"
            )
            target = f"/change-sets/{line.workspace_id}/{line.change_set_id}" if line.change_set_id else ""
            rows.append(
                f"<tr><td>{link(target, what) if target else esc(what)}</td><td>{esc(line.pause.cause)}</td>"
                f"<td>{esc(shorten(line.pause.reason, 160))}</td><td><code>{esc(fix)}</code></td></tr>"
            )
    if not rows:
        return ""
    return "<h2>Needs repair</h2>" + table(("what", "cause", "found", "repair"), rows, empty="")


# -- the audit trail ---------------------------------------------------------------------------------------------
def audit_body(total: int, entries: Sequence[dict[str, Any]], *, problem: str | None = None) -> str:
    """The newest entries of the audit trail (rebaser_client.admin.audit), newest first."""

    def cell(items: Any) -> str:
        return "<br>".join(esc(i) for i in items) if isinstance(items, list) else ""

    rows = [
        f'<tr class="outcome-{esc(e.get("outcome"))}"><td>{esc(e.get("at"))}</td><td>{esc(e.get("who"))}</td>'
        f"<td>{esc(e.get('source'))}</td><td>{esc(e.get('what'))}</td><td>{cell(e.get('targets'))}</td>"
        f"<td>{esc(e.get('outcome'))}</td><td>{cell(e.get('lines'))}</td></tr>"
        for e in entries
    ]
    note = (
        f'<p class="problem" id="audit-problem">{esc(problem)}</p>'
        if problem
        else f'<p class="note">the newest {len(entries)} of {total} entries (<code>rebaser audit</code> lists '
        "them too)</p>"
    )
    return (
        "<h1>Audit trail</h1>"
        + note
        + table(
            ("at", "who", "from", "what", "targets", "outcome", "said"),
            rows,
            table_id="audit",
            empty="no action recorded yet",
        )
    )
