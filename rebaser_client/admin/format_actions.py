"""The outcomes of operators' actions as lines for people and as JSON-able data: pausing, resuming, skipping and
replaying. Pure: no NATS, no I/O. The ``rebaser`` commands print them, and the web console shows the same lines
(``rebaser_client.admin.console``): one implementation, two faces.

rich (through :mod:`~rebaser_client.admin.format`) is imported by the functions that need it, not with this module:
the command line imports it to answer ``--help`` at once.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datetime import datetime

    from rebaser_client._pausing import PauseResult, ResumeResult
    from rebaser_client._skipping import SkipResult
    from rebaser_client.admin.repairs import ReplayResult

__all__ = [
    "pause_json",
    "pause_line",
    "plural",
    "replay_json",
    "replay_line",
    "resume_json",
    "resume_lines",
    "skip_json",
    "skip_line",
    "target_name",
]


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """``1 dead letter``, ``3 dead letters``, ``0 requests``."""
    return f"{count} {singular if count == 1 else plural_form or singular + 's'}"


def target_name(workspace_id: str, change_set_id: str | None) -> str:
    return (
        f"workspace {workspace_id}" if change_set_id is None else f"change set {workspace_id}/{change_set_id}"
    )


def pause_json(result: PauseResult, now: datetime) -> dict[str, Any]:
    from rebaser_client.admin.format import pause_json as pause_data

    return {
        "workspace_id": result.workspace_id,
        "change_set_id": result.change_set_id,
        "already_paused": result.already,
        "let_go": result.let_go,
        "pause": pause_data(result.pause, now),
    }


def pause_line(result: PauseResult, now: datetime) -> str:
    from rebaser_client.admin.format import pause_text

    what = target_name(result.workspace_id, result.change_set_id)
    if result.already:
        line = f"{what} was paused already, {pause_text(result.pause, now)}: that pause is kept"
    else:
        line = f"paused {what}" + (f" ({result.pause.reason})" if result.pause.reason else "")
    if result.let_go:
        line += "; no daemon holds it"
    elif result.let_go is None:
        line += "; its owner lets it go at its next request boundary"
    return line


def resume_json(result: ResumeResult, now: datetime) -> dict[str, Any]:
    from rebaser_client.admin.format import pause_json as pause_data

    data = asdict(result)
    data["was"] = None if result.was is None else pause_data(result.was, now)
    data["workspace_pause"] = (
        None if result.workspace_pause is None else pause_data(result.workspace_pause, now)
    )
    return data


def resume_lines(result: ResumeResult, now: datetime) -> list[str]:
    from rebaser_client.admin.format import pause_text

    what = target_name(result.workspace_id, result.change_set_id)
    head = (
        f"{what} was not paused"
        if result.was is None
        else f"resumed {what} (paused {pause_text(result.was, now)})"
    )
    if result.change_set_id is not None:
        if not result.queued:
            tasks = "nothing is queued"
        elif result.tasks_published:
            tasks = "gave it a task: a daemon takes it"
        else:
            tasks = "it has a task already"
    else:
        tasks = (
            f"{plural(result.queued, 'change set')} with requests queued: {result.tasks_published} given a task"
            + (f", {result.tasks_existing} had one" if result.tasks_existing else "")
        )
    lines = [f"{head}; {tasks}"]
    if result.left_to_sweep:
        lines.append(
            f"note: {plural(result.left_to_sweep, 'change set')} past the first {result.queued - result.left_to_sweep} "
            "get their task from the daemons' orphan sweep (within its interval, 30 s by default)"
        )
    if result.still_paused:
        lines.append(f"note: {plural(result.still_paused, 'change set')} paused on their own stay paused")
    if result.workspace_pause is not None:
        lines.append(
            f"note: its workspace is paused ({pause_text(result.workspace_pause, now)}): the change set stays "
            f"paused until `rebaser workspace resume {result.workspace_id}`"
        )
    return lines


def skip_json(result: SkipResult) -> dict[str, Any]:
    return asdict(result)


def skip_line(result: SkipResult) -> str:
    copy = "stored already as" if result.duplicate else "now"
    gone = "" if result.deleted else " (it had left the requests stream meanwhile)"
    return (
        f"skipped request {result.request_id} (seq {result.seq} of {result.stream}){gone}: {copy} dead letter "
        f"{result.dead_letter_seq} (`rebaser dlq show {result.dead_letter_seq}`); the change set stays paused: "
        f"`rebaser change-set resume {result.workspace_id} {result.change_set_id}`"
    )


def replay_json(result: ReplayResult) -> dict[str, Any]:
    return asdict(result)


def replay_line(result: ReplayResult) -> str:
    again = " (already stored: replayed before)" if result.duplicate else ""
    return (
        f"dead letter {result.dead_letter_seq}: replayed as request {result.request_id} "
        f"(was {result.original_id}) on {result.subject}{again}"
    )
