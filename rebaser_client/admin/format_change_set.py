"""``rebaser change-set show``'s report (:class:`~rebaser_client.admin.change_set.ChangeSetReport`) as JSON-able
data (``--json``) and as a rich table (for people): the task, the pauses, the record, the queued requests and the
last replies. Pure: no NATS, no I/O.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from rebaser_client._record import RecordView
from rebaser_client.admin.change_set import ChangeSetReport
from rebaser_client.admin.format import human_age, iso_utc, pause_json, pause_text, seconds_since, shorten
from rebaser_core.pauses import repair_command

__all__ = ["change_set_json", "change_set_view"]


def _record_json(record: RecordView | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "epoch": record.epoch,
        "owner": record.owner,
        "applied_seq": record.applied_seq,
        "dvu_pending": record.dvu_pending,
        "handed_back": record.handed_back,
        "attempts": dict(record.attempts),
        "suspect": list(record.suspect) if record.suspect else None,
        "last_error": record.last_error or None,  # the last retryable failure while attempts counts any
    }


def change_set_json(report: ChangeSetReport) -> dict[str, Any]:
    record = report.record
    return {
        "workspace_id": report.workspace_id,
        "change_set_id": report.change_set_id,
        "task": report.task,
        "paused": report.paused,
        # Its own pause first, then its workspace's ("via"): either one holds it.
        "pauses": [
            pause_json(pause, report.now, via=via)
            for via, pause in (("change_set", report.pause), ("workspace", report.workspace_pause))
            if pause is not None
        ],
        "record": _record_json(record),
        "queued_total": report.queued_total,
        "queued": [
            {
                "seq": q.seq,
                "request_id": q.request_id,
                "stored_at": iso_utc(q.time),
                "age_seconds": seconds_since(q.time, report.now),
                "bytes": q.size,
                "summary": q.summary,
                "processed": q.processed,
                "attempts": q.attempts,
            }
            for q in report.queued
        ],
        "last_replies": [
            {"request_id": r.request_id, "requested_at": iso_utc(r.at), "kind": r.kind, "detail": r.detail}
            for r in reversed(record.recent if record else ())
        ],
        "dead_letters": report.dead_letters,
    }


def change_set_view(report: ChangeSetReport, *, replies: int = 10) -> RenderableType:
    record = report.record
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("change set", f"{report.workspace_id} / {report.change_set_id}")
    owner = {"owned": "owned by a daemon", "waiting": "waiting for an owner", "none": "no task (idle)"}[
        report.task
    ]
    head.add_row("task", owner)
    if report.pause is not None:
        head.add_row("paused", Text(pause_text(report.pause, report.now), style="yellow"))
        if fix := repair_command(report.pause, report.workspace_id, report.change_set_id):
            head.add_row("repair", Text(fix, style="yellow"))
    if report.workspace_pause is not None:
        head.add_row(
            "paused" if report.pause is None else "workspace paused",
            Text(f"with its workspace, {pause_text(report.workspace_pause, report.now)}", style="yellow"),
        )
    if record is None:
        head.add_row("record", "none (never processed)")
    else:
        # The record names the daemon that owned it last: its owner only while a daemon holds the task.
        head.add_row(
            "owner" if report.task == "owned" else "last owner",
            f"{record.owner} (epoch {record.epoch}{', handed back' if record.handed_back else ''})",
        )
        head.add_row("applied up to", f"stream sequence {record.applied_seq}")
        head.add_row("DVU pending", "yes" if record.dvu_pending else "no")
        if record.suspect:
            head.add_row(
                "suspect", f"seq {record.suspect[0]}: {record.suspect[1]} owners died or froze on it"
            )
        if record.attempts and record.last_error:
            head.add_row("last error", Text(record.last_error, style="red"))
    head.add_row("dead letters", str(report.dead_letters))
    queued = Table(
        title=f"queued requests: {report.queued_total}"
        + (f" (the first {len(report.queued)})" if len(report.queued) < report.queued_total else ""),
        title_justify="left",
    )
    for column in ("seq", "request id", "age", "bytes", "what", "state"):
        queued.add_column(column, justify="right" if column in ("seq", "bytes", "age") else "left")
    for q in report.queued:
        state = "processed, awaiting purge" if q.processed else "queued"
        if q.attempts:
            state += f", {q.attempts} failed attempts"
        queued.add_row(
            str(q.seq), q.request_id or "?", human_age(q.age(report.now)), str(q.size), q.summary, state
        )
    parts: list[RenderableType] = [head, queued if report.queued else Text("queued requests: none")]
    if record is not None and record.recent:
        last = Table(title=f"last replies (newest first, {len(record.recent)} kept)", title_justify="left")
        for column in ("request id", "age", "outcome", "detail"):
            last.add_column(column)
        for r in list(reversed(record.recent))[:replies]:
            age = human_age(seconds_since(r.at, report.now))
            last.add_row(r.request_id, age, r.kind, shorten(r.detail, 100))
        parts.append(last)
    return Group(*parts)
