"""The console's actions: pause, resume, skip, replay and drop, one target or many. Each goes through the code the
``rebaser`` commands call (the library's pausing and skipping, ``rebaser_client.admin.repairs``) and says what it
did in the commands' own words (:mod:`~rebaser_client.admin.format_actions`): one implementation, two faces.

An action is asked twice, as a command asks before it deletes or sends again: :func:`plan` looks the targets up
(a filter becomes the explicit change sets or dead letters it matches now, what is missing or cannot be done is
refused before anything is) and returns the question and what to send to do it; :func:`run` does exactly that.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from rebaser_client._pausing import pause_change_set, pause_workspace, resume_change_set, resume_workspace
from rebaser_client._skipping import check_skip, skip_request
from rebaser_client.admin.console.index import Filter
from rebaser_client.admin.console.live import Live
from rebaser_client.admin.dead_letters import NoDeadLetter, dead_letter, dead_letters
from rebaser_client.admin.format_actions import (
    pause_line,
    plural,
    replay_line,
    resume_lines,
    skip_line,
    target_name,
)
from rebaser_client.admin.repairs import check_replayable, drop_dead_letters, replay_dead_letters
from rebaser_core.errors import HeldByDaemon, RebaserError, RebaserRefused
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk

__all__ = ["ACTIONS", "BULK_MAX", "Outcome", "Plan", "plan", "run", "targets_of"]

T = TypeVar("T")

ACTIONS = ("pause", "resume", "skip", "replay", "drop")
BULK_MAX = 10_000  # change sets or dead letters one action takes at most (the rest: run it again)
_LISTED = 20  # targets named in a question (the rest are counted)
# A single change set's pause waits until its owner lets it go, so its outcome can say so; a bulk one does not wait.
_PAUSE_WAIT = 10.0
_HELD_PATIENCE = 5.0


@dataclass(frozen=True)
class Plan:
    question: str
    targets: list[str]  # what the action touches, for people (at most _LISTED)
    body: dict[str, Any]  # what to send to do it: explicit targets, never a filter


@dataclass(frozen=True)
class Outcome:
    ok: bool
    lines: list[str] = field(default_factory=list)


def _error(err: RebaserError) -> str:
    return f"{type(err).__name__}: {err}"


def _change_sets(body: dict[str, Any], live: Live) -> list[tuple[WorkspacePk, ChangeSetId | None]]:
    """The targets of a pause or resume: explicit (a change set, or a workspace with no change set) or a filter's."""
    if "filter" in body:
        flt = Filter.parse({k: str(v) for k, v in dict(body["filter"] or {}).items()})
        rows = list(live.index.matching(flt))[:BULK_MAX]
        return [(WorkspacePk(r.workspace_id), ChangeSetId(r.change_set_id)) for r in rows]
    out: list[tuple[WorkspacePk, ChangeSetId | None]] = []
    for t in body.get("targets") or []:
        cs = t.get("change_set_id")
        out.append((WorkspacePk(t["workspace_id"]), None if cs is None else ChangeSetId(cs)))
    return out[:BULK_MAX]


async def _seqs(body: dict[str, Any], live: Live) -> list[int]:
    if "filter" in body:
        q = dict(body["filter"] or {})
        wk = WorkspacePk(q["workspace"]) if q.get("workspace") else None
        cs = ChangeSetId(q["change_set"]) if q.get("change_set") else None
        if cs is not None and wk is None:
            raise RebaserRefused("a change set's dead letters need its workspace too")
        _, letters = await dead_letters(
            live.nc, live.subjects, workspace_id=wk, change_set_id=cs, limit=BULK_MAX
        )
        return [d.seq for d in letters]
    seqs = [int(s) for s in body.get("seqs") or []]
    if any(s < 1 for s in seqs):
        raise RebaserRefused("a dead letter's sequence is 1 or more")
    return seqs[:BULK_MAX]


async def _patient(attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()``, tried again for up to _HELD_PATIENCE seconds while a daemon holds the paused change set. Under
    load every new request publishes a task, and a daemon that takes a paused change set's task holds it for a
    moment before it acks it: the command says "try again in a moment", the console does it for the operator."""
    deadline = time.monotonic() + _HELD_PATIENCE
    while True:
        try:
            return await attempt()
        except HeldByDaemon:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


def _held(live: Live, wk: WorkspacePk, cs: ChangeSetId) -> bool:
    """Whether a daemon held the change set's task when the console last read it (unknown: held)."""
    row = live.row_of(str(wk), str(cs))
    return row is None or row.task == "owned"


def _named(names: list[str]) -> list[str]:
    return names[:_LISTED] + ([f"… and {len(names) - _LISTED} more"] if len(names) > _LISTED else [])


async def plan(live: Live, action: str, body: dict[str, Any]) -> Plan:
    """What ``action`` would do with ``body``, as a question; :class:`RebaserRefused` (nothing done) if it cannot."""
    if action in ("pause", "resume"):
        targets = _change_sets(body, live)
        if not targets:
            raise RebaserRefused(f"nothing to {action}: no change set matches")
        names = [target_name(str(wk), None if cs is None else str(cs)) for wk, cs in targets]
        what = names[0] if len(names) == 1 else plural(len(names), "change set")
        verb = "Pause" if action == "pause" else "Resume"
        note = (
            " (every change set of it, those created later too)"
            if len(targets) == 1 and targets[0][1] is None
            else ""
        )
        explicit = [
            {"workspace_id": str(wk), "change_set_id": None if cs is None else str(cs)} for wk, cs in targets
        ]
        return Plan(
            f"{verb} {what}{note}?",
            _named(names),
            {"targets": explicit, "reason": str(body.get("reason") or "")},
        )
    if action == "skip":
        wk, cs = WorkspacePk(body["workspace_id"]), ChangeSetId(body["change_set_id"])
        rid = RequestId(body["request_id"])
        target = await _patient(lambda: check_skip(live.nc, live.subjects, wk, cs, rid))
        question = (
            f"Move request {target.request_id} (seq {target.seq}), first in line of {wk}/{cs}, "
            "to the dead letters?"
        )
        return Plan(
            question,
            [f"request {target.request_id}"],
            {"workspace_id": str(wk), "change_set_id": str(cs), "request_id": str(rid)},
        )
    if action in ("replay", "drop"):
        seqs = await _seqs(body, live)
        if not seqs:
            raise RebaserRefused(f"nothing to {action}: no dead letter matches")
        for seq in seqs if "seqs" in body else ():
            letter = await dead_letter(live.nc, live.subjects, seq)
            if letter is None:
                raise NoDeadLetter(seq)
            if action == "replay":
                check_replayable(letter)
        what = f"dead letter {seqs[0]}" if len(seqs) == 1 else plural(len(seqs), "dead letter")
        question = f"Replay {what} as new requests?" if action == "replay" else f"Delete {what} for good?"
        return Plan(question, _named([f"dead letter {s}" for s in seqs]), {"seqs": seqs})
    raise RebaserRefused(f"no such action: {action}")


def targets_of(action: str, body: dict[str, Any]) -> list[str]:
    """The explicit targets of ``body`` (what :func:`plan` returned), named for the audit log."""
    if action in ("pause", "resume"):
        return [
            target_name(
                str(t.get("workspace_id")),
                None if t.get("change_set_id") is None else str(t["change_set_id"]),
            )
            for t in body.get("targets") or []
            if isinstance(t, dict)
        ]
    if action == "skip":
        return [f"{body.get('workspace_id')}/{body.get('change_set_id')} request {body.get('request_id')}"]
    return [f"dead letter {s}" for s in body.get("seqs") or []]


async def run(live: Live, action: str, body: dict[str, Any], *, by: str | None = None) -> Outcome:
    """Do ``action`` on the explicit targets of ``body`` (what :func:`plan` returned); each target's outcome.
    ``by``: who asks (stored with a pause)."""
    nc, subjects, now = live.nc, live.subjects, datetime.now(UTC)
    lines: list[str] = []
    ok = True
    try:
        if action in ("pause", "resume"):
            targets = _change_sets({"targets": body.get("targets") or []}, live)
            reason = str(body.get("reason") or "")[:500] or "paused from the web console"
            wait = _PAUSE_WAIT if len(targets) == 1 else None
            for wk, cs in targets:
                try:
                    if action == "pause" and cs is None:
                        lines.append(
                            pause_line(await pause_workspace(nc, subjects, wk, reason, wait=None, by=by), now)
                        )
                    elif action == "pause":
                        assert cs is not None
                        result = await pause_change_set(nc, subjects, wk, cs, reason, wait=wait, by=by)
                        if result.let_go is None and not _held(live, wk, cs):
                            # Not waited for (a bulk pause), and no daemon held it as the console last read: say
                            # so, rather than that an owner it does not have lets it go.
                            result = replace(result, let_go=True)
                        lines.append(pause_line(result, now))
                    elif cs is None:
                        lines.extend(resume_lines(await resume_workspace(nc, subjects, wk), now))
                    else:
                        lines.extend(resume_lines(await resume_change_set(nc, subjects, wk, cs), now))
                except RebaserError as err:
                    ok = False
                    lines.append(f"{target_name(str(wk), None if cs is None else str(cs))}: {_error(err)}")
        elif action == "skip":
            wk, cs = WorkspacePk(body["workspace_id"]), ChangeSetId(body["change_set_id"])
            rid = RequestId(body["request_id"])
            lines.append(skip_line(await _patient(lambda: skip_request(nc, subjects, wk, cs, rid))))
        elif action == "replay":
            for outcome in await replay_dead_letters(nc, subjects, [int(s) for s in body.get("seqs") or []]):
                if isinstance(outcome, tuple):
                    ok = False
                    lines.append(f"dead letter {outcome[0]}: not replayed: {_error(outcome[1])}")
                else:
                    lines.append(replay_line(outcome))
        elif action == "drop":
            seqs = tuple(int(s) for s in body.get("seqs") or [])
            lines.append(f"dropped {plural(await drop_dead_letters(nc, subjects, seqs), 'dead letter')}")
        else:
            raise RebaserRefused(f"no such action: {action}")
    except RebaserError as err:
        ok = False
        lines.append(_error(err))
    live.poke()  # what it changed shows at once, not at the next refresh
    return Outcome(ok, lines)
