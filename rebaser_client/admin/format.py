"""The admin reports as JSON-able data (``--json``) and as rich tables (for people): ``status``, the dead letters,
pauses, and the helpers the other formatting modules share (``change-set show``'s report is
:mod:`~rebaser_client.admin.format_change_set`'s). Pure: no NATS, no I/O."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from rebaser_client._pause_read import PausedLine
from rebaser_client.admin.dead_letters import DeadLetter
from rebaser_client.admin.format_workspaces import workspaces_json, workspaces_view
from rebaser_client.admin.reader import StreamSummary
from rebaser_client.admin.status import StatusReport
from rebaser_core.nats.durability import Durability
from rebaser_core.pauses import Pause, repair_command

__all__ = [
    "dead_letter_json",
    "dead_letter_view",
    "dead_letters_json",
    "dead_letters_view",
    "human_age",
    "iso_utc",
    "pause_json",
    "pause_text",
    "seconds_since",
    "shorten",
    "status_json",
    "status_view",
]


def human_age(seconds: float | None) -> str:
    """``0.4s``, ``12s``, ``4m05s``, ``2h03m``, ``3d04h``; ``-`` if unknown."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def shorten(text: str, width: int) -> str:
    """``text`` cut to at most ``width`` characters at a word boundary, with an ellipsis if anything was cut (in the
    middle of a word only if its first word alone is that long)."""
    text = " ".join(text.split())  # one line: a reason may hold a traceback's line breaks
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    space = cut.rfind(" ")
    if space > 0 and text[width - 1] != " ":
        cut = cut[:space]
    return cut.rstrip(" ,;:.-") + "…"


def _sequences(s: StreamSummary) -> str:
    """A stream's first and last sequence; an empty stream has none, but the sequence its next message gets."""
    if not s.messages:
        return f"empty (next {s.last_seq + 1})"
    return f"{s.first_seq}..{s.last_seq}"


def iso_utc(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def seconds_since(value: datetime | None, now: datetime) -> float | None:
    return None if value is None else round(max(0.0, (now - value).total_seconds()), 3)


# -- pauses --------------------------------------------------------------------------------------------------------
def pause_json(pause: Pause, now: datetime, **extra: Any) -> dict[str, Any]:
    """A pause as JSON: cause, reason, since (UTC), how long ago, the request that kept failing; then ``extra``."""
    return {
        **extra,
        "cause": pause.cause,
        "reason": pause.reason,
        "since": iso_utc(datetime.fromtimestamp(pause.since, UTC)),
        "paused_seconds": seconds_since(datetime.fromtimestamp(pause.since, UTC), now),
        "request_id": pause.request_id,
        **({"by": pause.by} if pause.by is not None else {}),  # who asked, when the pause says (the console)
    }


def pause_text(pause: Pause, now: datetime) -> str:
    """``for 4m05s (operator: deploying a fix)``, ``… request 01J…`` for a pause after max_attempts."""
    age = human_age(seconds_since(datetime.fromtimestamp(pause.since, UTC), now))
    why = f"{pause.cause}: {shorten(pause.reason, 100)}" if pause.reason else pause.cause
    request = f", request {pause.request_id}" if pause.request_id else ""
    by = f", by {shorten(pause.by, 80)}" if pause.by else ""
    return f"for {age} ({why}{request}{by})"


def _paused_line_json(line: PausedLine, now: datetime) -> dict[str, Any]:
    return pause_json(
        line.pause,
        now,
        workspace_id=line.workspace_id,
        change_set_id=line.change_set_id,
        queued=line.queued,
        repair=repair_command(
            line.pause, line.workspace_id, line.change_set_id
        ),  # None: a pause someone decided
    )


def _pauses_view(report: StatusReport, now: datetime) -> RenderableType:
    listed = len(report.pauses)
    total = f"{report.pauses_total}+" if report.pauses_more else str(report.pauses_total)
    if not listed:
        return Text("paused: none")
    table = Table(
        title=f"paused change sets and workspaces: {total}"
        + (f" (the {listed} oldest listed)" if report.pauses_more or listed < report.pauses_total else ""),
        title_justify="left",
    )
    for column in ("workspace", "change set", "since", "cause", "reason", "request", "queued"):
        table.add_column(column, justify="right" if column in ("since", "queued") else "left")
    for line in report.pauses:
        pause = line.pause
        table.add_row(
            line.workspace_id,
            line.change_set_id or "(all)",
            human_age(seconds_since(datetime.fromtimestamp(pause.since, UTC), now)),
            pause.cause,
            shorten(pause.reason, 80) or "-",
            pause.request_id or "-",
            str(line.queued),
        )
    # A pause that stands for damage (an unreadable record or pause entry) is named with the command that repairs it.
    repairs = [
        (line, repair_command(line.pause, line.workspace_id, line.change_set_id)) for line in report.pauses
    ]
    fixes = [f"repair {ln.workspace_id}/{ln.change_set_id or '(all)'}: {cmd}" for ln, cmd in repairs if cmd]
    return Group(table, Text("\n".join(fixes), style="yellow")) if fixes else table


# -- status --------------------------------------------------------------------------------------------------------
def status_json(report: StatusReport, now: datetime | None = None) -> dict[str, Any]:
    now = now or datetime.now(UTC)
    return {
        "prefix": report.prefix,
        "streams": [
            {
                "name": s.name,
                "exists": s.messages is not None,
                "messages": s.messages,
                "bytes": s.bytes,
                "first_seq": s.first_seq,
                "last_seq": s.last_seq,
                "consumers": s.consumers,
                "replicas": s.replicas,
            }
            for s in report.streams
        ],
        "durability": None if report.durability is None else report.durability.as_dict(),
        "durability_from": report.durability_from,  # a daemon's finding ("<daemon> at <time>"), or null: read here
        "tasks_consumer": dict(report.tasks_consumer) if report.tasks_consumer is not None else None,
        "change_set_records": report.records,
        "lease_heartbeats": report.heartbeats,  # lease_mode daemon: heartbeat keys; null: no bucket (task mode)
        "owners": report.owners,
        "change_sets_total": report.change_sets_total,
        "change_sets": [
            {
                "workspace_id": line.workspace_id,
                "change_set_id": line.change_set_id,
                "queued": line.queued,
                "task": line.task,
                "owner": line.owner,
                "epoch": line.epoch,
                "dvu_pending": line.dvu_pending,
                "dead_letters": line.dead_letters,
            }
            for line in report.change_sets
        ],
        "pauses_total": report.pauses_total,
        "pauses_more": report.pauses_more,  # more than were read: pauses_total counts only those read
        "pauses": [_paused_line_json(line, now) for line in report.pauses],
        # The busiest workspaces; owned and waiting are null unless a daemon's /status was read (--daemon-url).
        **workspaces_json(report.workspaces, report.workspaces_total, report.daemons),
    }


def status_view(report: StatusReport, now: datetime | None = None) -> RenderableType:
    prefix = f"prefix {report.prefix}" if report.prefix else "no prefix: the default names"
    streams = Table(title=f"streams ({prefix})", title_justify="left")
    for column in ("stream", "messages", "bytes", "sequences", "consumers", "replicas"):
        streams.add_column(column, justify="left" if column == "stream" else "right")
    for s in report.streams:
        if s.messages is None:
            streams.add_row(s.name, Text("missing", style="red"), "", "", "", "")
        else:
            streams.add_row(
                s.name, str(s.messages), str(s.bytes), _sequences(s), str(s.consumers), str(s.replicas)
            )
    parts: list[RenderableType] = [streams]
    if report.durability is not None:
        parts.append(_durability_line(report.durability, report.durability_from))
    c = report.tasks_consumer
    parts.append(
        Text(
            "tasks consumer: missing"
            if c is None
            else f"tasks consumer: {c['pending']} change sets waiting for an owner, {c['ack_pending']} owned, "
            f"{c['redelivered']} redelivered, {c['waiting_pulls']} daemon pulls waiting; "
            f"{report.records if report.records is not None else '?'} change-set records"
        )
    )
    parts.append(Text(_leases_line(report.heartbeats)))
    if report.owners:
        owners = Table(title="owners", title_justify="left")
        owners.add_column("daemon")
        owners.add_column("owned change sets", justify="right")
        for owner, count in sorted(report.owners.items(), key=lambda kv: -kv[1]):
            owners.add_row(owner, str(count))
        parts.append(owners)
    listed = len(report.change_sets)
    change_sets = Table(
        title=f"change sets with work or dead letters: {report.change_sets_total}"
        + (f" (the {listed} busiest listed)" if listed < report.change_sets_total else ""),
        title_justify="left",
    )
    for column in ("workspace", "change set", "queued", "task", "owner", "epoch", "DVU due", "dead letters"):
        change_sets.add_column(
            column, justify="right" if column in ("queued", "epoch", "dead letters") else "left"
        )
    for line in report.change_sets:
        change_sets.add_row(
            line.workspace_id,
            line.change_set_id,
            str(line.queued),
            line.task,
            line.owner or "-",
            "-" if line.epoch is None else str(line.epoch),
            "-" if line.dvu_pending is None else ("yes" if line.dvu_pending else "no"),
            str(line.dead_letters),
        )
    parts.append(change_sets if report.change_sets else Text("change sets with work or dead letters: none"))
    parts.append(workspaces_view(report.workspaces, report.workspaces_total, report.daemons))
    parts.append(_pauses_view(report, now or datetime.now(UTC)))
    return Group(*parts)


def _leases_line(heartbeats: int | None) -> str:
    if heartbeats is None:
        return (
            "leases: lease_mode task (no daemon heartbeat bucket): each owned change set renews its own task"
        )
    return (
        f"leases: lease_mode daemon, {heartbeats} daemon heartbeat{'' if heartbeats == 1 else 's'} "
        "(one key per daemon; a silent daemon's change sets are handed back by its peers)"
    )


def _durability_line(durability: Durability, found_by: str | None = None) -> Text:
    warning = durability.warning()
    line = f"durability: {durability.level} (sync {durability.sync}, replicas {durability.min_replicas})"
    if found_by:
        line += f", as the daemon {found_by} found it"
    if warning is None:
        return Text(line)
    return Text(f"{line}\n  {warning}", style="yellow")


# -- dead letters --------------------------------------------------------------------------------------------------
def dead_letter_json(letter: DeadLetter, *, full: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "seq": letter.seq,
        "dead_lettered_at": iso_utc(letter.time),
        "subject": letter.subject,
        "original_seq": letter.original_seq,
        "workspace_id": letter.workspace_id,
        "change_set_id": letter.change_set_id,
        "request_id": letter.request_id,
        "reason": letter.reason,
        "bytes": letter.size,
        "truncated_from": letter.truncated,
    }
    if full:
        data["trace"] = None if letter.trace is None else letter.trace.split(" > ")
        data["headers"] = dict(letter.request_headers())
        body = letter.body()
        data["request"] = body
        if body is None:
            data["body_text"] = letter.data.decode("utf-8", "backslashreplace")[:4096]
    return data


def dead_letters_json(total: int, letters: list[DeadLetter]) -> dict[str, Any]:
    return {"total": total, "dead_letters": [dead_letter_json(d) for d in letters]}


def dead_letters_view(total: int, letters: list[DeadLetter], now: datetime) -> RenderableType:
    if not letters:
        return Text(f"dead letters: {total}")
    table = Table(
        title=f"dead letters: {total}" + (f" (the oldest {len(letters)})" if len(letters) < total else ""),
        title_justify="left",
    )
    for column in ("seq", "age", "change set", "request id", "reason"):
        table.add_column(column, justify="right" if column in ("seq", "age") else "left")
    for d in letters:
        where = f"{d.workspace_id}/{d.change_set_id}" if d.change_set_id else d.subject
        table.add_row(
            str(d.seq),
            human_age(seconds_since(d.time, now)),
            where,
            d.request_id or "?",
            shorten(d.reason, 120),
        )
    return table


def dead_letter_view(letter: DeadLetter) -> RenderableType:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in dead_letter_json(letter).items():
        grid.add_row(key, "-" if value is None else str(value))
    if letter.trace:
        # The app's frames, outermost first: the last line is where it was raised.
        grid.add_row("raised in the app", "\n".join(letter.trace.split(" > ")))
    for name, value in letter.request_headers().items():
        grid.add_row(f"header {name}", value)
    body = letter.body()
    text = (
        json.dumps(body, indent=2)
        if body is not None
        else letter.data.decode("utf-8", "backslashreplace")[:4096]
    )
    return Group(
        grid, Text("request:" if body is not None else "body (not decodable):", style="bold"), Text(text)
    )
