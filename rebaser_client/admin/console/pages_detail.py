"""One change set, and the dead letters, as HTML. Pure: they render the reports ``rebaser change-set show`` and
``rebaser dlq list|show`` print (:mod:`~rebaser_client.admin.change_set`, :mod:`~rebaser_client.admin.dead_letters`).

A change set's page has two live parts: its details (:func:`change_set_detail`, rendered again when its row
changes) and its timeline, one :func:`event_html` per event of the feed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rebaser_client.admin.change_set import ChangeSetReport
from rebaser_client.admin.console.html import action_button, age_cell, badges, esc, link, table, when
from rebaser_client.admin.console.index import Row
from rebaser_client.admin.dead_letters import DeadLetter
from rebaser_client.admin.format import pause_text, shorten
from rebaser_client.admin.format_actions import plural
from rebaser_core.pauses import repair_command

__all__ = [
    "change_set_body",
    "change_set_detail",
    "dead_letter_body",
    "dead_letters_body",
    "dead_letters_part",
    "event_html",
]


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _repair(report: ChangeSetReport) -> str | None:
    if report.pause is None:
        return None
    return repair_command(report.pause, report.workspace_id, report.change_set_id)


def change_set_detail(
    workspace_id: str,
    change_set_id: str,
    report: ChangeSetReport | None,
    row: Row | None,
    states: tuple[str, ...],
    *,
    read_only: bool,
) -> str:
    """What the change set is now: its state, owner, pause, queue, last replies and dead letters."""
    if report is None:
        return (
            '<p class="empty">JetStream knows nothing of this change set: no record, no request, no task, '
            "no dead letter, no pause.</p>"
        )
    now = report.now
    record = report.record
    target = {"targets": [{"workspace_id": workspace_id, "change_set_id": change_set_id}]}
    actions = ""
    if not read_only:
        actions = (
            action_button("resume", "Resume", target)
            if report.pause
            else action_button("pause", "Pause", target)
        )
    dvu = (
        "running"
        if row is not None and row.dvu_running
        else "due"
        if record and record.dvu_pending
        else "none"
    )
    pauses = [f"its own, {pause_text(report.pause, now)}" for _ in [0] if report.pause] + [
        f"its workspace's, {pause_text(report.workspace_pause, now)}" for _ in [0] if report.workspace_pause
    ]
    facts = (
        ("state", badges(states)),
        # The record names the daemon that held it last: its owner only while a daemon holds its task.
        (
            "owner" if report.task == "owned" else "last owner",
            esc(f"{record.owner} (epoch {record.epoch})" if record else "-") + f" · task {esc(report.task)}",
        ),
        ("paused", esc("; ".join(pauses) or "no") + f" {actions}"),
        # A pause that stands for damage (an unreadable record or pause entry): the command that repairs it.
        *[("repair", f"<code>{esc(fix)}</code>") for fix in [_repair(report)] if fix],
        # Retrying: the last attempt's failure, as the daemon recorded it (class and message, bounded).
        *[
            (
                "last error",
                f'<span class="error" id="last-error">{esc(shorten(record.last_error, 300))}</span>',
            )
            for _ in [0]
            if record and record.attempts and record.last_error
        ],
        ("queued", f"{report.queued_total}"),
        ("applied up to", esc(record.applied_seq if record else "-")),
        ("DVU", esc(dvu)),
        ("events", esc(record.events if record else 0)),
    )
    head = (
        '<table class="facts">' + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts) + "</table>"
    )
    first_unprocessed = next((q for q in report.queued if not q.processed), None)
    queue_rows = []
    for q in report.queued:
        skip = ""
        if q is first_unprocessed and report.pause is not None and q.request_id and not read_only:
            skip = action_button(
                "skip",
                "skip",
                {"workspace_id": workspace_id, "change_set_id": change_set_id, "request_id": q.request_id},
                danger=True,
            )
        queue_rows.append(
            f"<tr><td class=n>{q.seq}</td><td>{esc(q.request_id or '?')}</td>{age_cell(_ts(q.time))}"
            f"<td class=n>{q.size}</td><td>{esc(q.summary)}</td><td>{'processed' if q.processed else ''}</td>"
            f"<td class=n>{q.attempts or ''}</td><td>{skip}</td></tr>"
        )
    queue = f"<h2>Queue: {plural(report.queued_total, 'request')}</h2>" + table(
        ("seq", "request", "age", "bytes", "what", "", "attempts", ""), queue_rows, empty="nothing queued"
    )
    replies = []
    for reply in reversed(record.recent[-10:] if record else ()):
        replies.append(
            f"<tr><td>{esc(reply.request_id)}</td><td>{esc(when(_ts(reply.at)))}</td>"
            f'<td><span class="badge {esc(reply.kind)}">{esc(reply.kind)}</span></td>'
            f"<td>{esc(shorten(reply.detail, 200))}</td></tr>"
        )
    last = "<h2>Last replies</h2>" + table(
        ("request", "made", "reply", "detail"), replies, empty="none recorded"
    )
    dead = f"<h2>Dead letters: {report.dead_letters}</h2>" + (
        f"<p>{link('/dead-letters', 'Show them', {'workspace': workspace_id, 'change_set': change_set_id})}</p>"
        if report.dead_letters
        else ""
    )
    return head + queue + last + dead


def change_set_body(
    workspace_id: str, change_set_id: str, detail: str, *, since: int | None, feed_on: bool | None
) -> str:
    """The page of one change set: its timeline (or, with the feed off, what to turn on in its place: no empty
    table whose header would run into what follows), then what it is now (:func:`change_set_detail`)."""
    since_value = "" if since is None else str(since)
    if feed_on is False:
        timeline = (
            '<p class="banner" id="feed-off">No event feed yet: no daemon has started on this deployment, '
            "and this change set's timeline comes from the writes of its record.</p>"
        )
    else:
        timeline = (
            f'<form method="get" class="filter">from durable event <input name="since" size="6" '
            f'value="{esc(since_value)}"> <button>Show</button></form>'
            '<div class="timeline"><table id="timeline"><thead><tr><th>time</th><th>seq</th><th>event</th>'
            '<th>details</th></tr></thead><tbody><tr class="empty"><td colspan="4">no event yet: they show here as '
            "they happen</td></tr></tbody></table></div>"
        )
    return (
        f"<h1>Change set {esc(change_set_id)}</h1>"
        f"<p>workspace {link('/change-sets', workspace_id, {'workspace': workspace_id})}</p>"
        f"<h2>Timeline, newest first</h2>{timeline}"
        f'<h2>Now</h2><section id="detail">{detail}</section>'
    )


def event_html(event: Any) -> str:
    """One row of the timeline (``event``: a ChangeSetEvent); its id lets the browser drop one it has already."""
    parts: list[str] = []
    if event.request_id is not None:
        parts.append(f"request {event.request_id}")
    for label, value in (
        ("status", event.status),
        ("updates", event.updates_performed),
        ("conflicts", event.conflicts),
        ("reason", event.reason),
        ("error", event.error),
        ("queued behind", event.queued),
    ):
        if value is not None:
            parts.append(f"{label} {value}")
    if event.duration_s is not None:
        parts.append(f"{event.duration_s * 1000:.1f} ms")
    if event.kind in ("taken", "released"):
        parts.append(f"owner {event.owner} epoch {event.epoch}")
    if event.settled:
        parts.append("settled")
    seq = f"#{event.seq}" if event.durable else f"(after #{event.seq})"
    return (
        f'<tr data-id="{esc(event.id)}" data-seq="{event.seq if event.durable else ""}" class="ev {esc(event.kind)}">'
        f"<td>{esc(when(event.at))}</td><td class=n>{esc(seq)}</td><td>{esc(event.kind)}</td>"
        f"<td>{esc(', '.join(parts))}</td></tr>"
    )


# -- dead letters ----------------------------------------------------------------------------------------------------
def dead_letters_body(
    total: int, letters: list[DeadLetter], query: dict[str, str], *, read_only: bool
) -> str:
    """The dead letters page: its filter, then :func:`dead_letters_part` (what a live update replaces whole, the
    count and the bulk buttons with the list, so they always say the same)."""
    form = (
        '<form method="get" action="/dead-letters" class="filter">'
        f'<label>workspace <input name="workspace" size="30" value="{esc(query.get("workspace", ""))}"></label>'
        f'<label>change set <input name="change_set" size="30" value="{esc(query.get("change_set", ""))}"></label>'
        '<button type="submit">Filter</button> <a href="/dead-letters">clear</a></form>'
    )
    part = dead_letters_part(total, letters, query, read_only=read_only)
    return f'<h1>Dead letters</h1>{form}<div id="dead-letters">{part}</div>'


def dead_letters_part(
    total: int, letters: list[DeadLetter], query: dict[str, str], *, read_only: bool
) -> str:
    """The bulk buttons, the count and the list of the dead letters (the part of the page kept live)."""
    bulk = ""
    if not read_only and total:
        where = {"filter": query}
        bulk = (
            '<div class="bulk">On this filter: '
            + action_button("replay", f"Replay these {total}", where)
            + action_button("drop", f"Drop these {total}", where, danger=True)
            + "</div>"
        )
    rows = []
    for d in letters:
        acts = ""
        if not read_only:
            acts = action_button("replay", "replay", {"seqs": [d.seq]}) + action_button(
                "drop", "drop", {"seqs": [d.seq]}, danger=True
            )
        place = (
            link(f"/change-sets/{d.workspace_id}/{d.change_set_id}", f"{d.workspace_id}/{d.change_set_id}")
            if d.workspace_id and d.change_set_id
            else esc(d.subject)
        )
        rows.append(
            f'<tr id="dl-{d.seq}"><td class=n>{link(f"/dead-letters/{d.seq}", d.seq)}</td>{age_cell(_ts(d.time))}'
            f"<td>{place}</td><td>{esc(d.request_id or '?')}</td><td>{esc(shorten(d.reason, 120))}</td>"
            f"<td class=n>{d.size}</td><td>{acts}</td></tr>"
        )
    shown = (
        f'<p class=summary id="dead-letters-count">{plural(total, "dead letter")}'
        + (f", the oldest {len(letters)} listed" if total > len(letters) else "")
        + "</p>"
    )
    return (
        bulk
        + shown
        + table(
            ("seq", "age", "change set", "request", "reason", "bytes", ""),
            rows,
            table_id="letters",
            empty="no dead letters",
        )
    )


def dead_letter_body(letter: DeadLetter, *, read_only: bool) -> str:
    acts = ""
    if not read_only:
        acts = action_button("replay", "Replay", {"seqs": [letter.seq]}) + action_button(
            "drop", "Drop", {"seqs": [letter.seq]}, danger=True
        )
    facts = (
        ("stored", when(_ts(letter.time))),
        ("subject", letter.subject),
        ("original sequence", letter.original_seq),
        ("request", letter.request_id),
        ("bytes", letter.size if letter.truncated is None else f"{letter.size} of {letter.truncated} (cut)"),
        ("reason", letter.reason),
    )
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts)
    headers = "".join(
        f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in letter.request_headers().items()
    )
    body = letter.body()
    shown = json.dumps(body, indent=2) if body is not None else "(cannot be decoded)"
    trace = f"<h2>Where the app raised it</h2><pre>{esc(letter.trace)}</pre>" if letter.trace else ""
    now = datetime.now(UTC)
    return (
        f"<h1>Dead letter {letter.seq}</h1><p>{acts}</p><table class=facts>{rows}</table>{trace}"
        f"<h2>Request headers</h2><table class=facts>{headers}</table><h2>Request</h2><pre>{esc(shown)}</pre>"
        f'<p class="summary">read {esc(now.strftime("%H:%M:%S"))}Z</p>'
    )
