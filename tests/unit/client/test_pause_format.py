"""Pauses as operators read them: ``change-set show`` and ``status`` (JSON and tables), the lines of ``change-set
pause|resume|skip`` and ``workspace pause|resume``, and the copy a skip stores in the dead letters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rich.console import Console

from rebaser_client._pause_read import PausedLine
from rebaser_client._pausing import PauseResult, ResumeResult
from rebaser_client._record import RecordView
from rebaser_client._skipping import SkipResult
from rebaser_client.admin import format as fmt
from rebaser_client.admin import format_change_set as fmt_cs
from rebaser_client.admin.change_set import ChangeSetReport
from rebaser_client.admin.cli.pause import (
    pause_json,
    pause_line,
    resume_json,
    resume_lines,
    skip_json,
    skip_line,
)
from rebaser_client.admin.reader import StreamSummary
from rebaser_client.admin.status import StatusReport
from rebaser_core import headers as h
from rebaser_core.dead_letter_copy import bounded_copy, dead_letter_marks, dead_letter_subject
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.pauses import Pause
from rebaser_core.subjects import Subjects
from rebaser_server.record.model import ChangeSetRecord

WK, CS = WorkspacePk.new(), ChangeSetId.new()
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
OPERATOR = Pause("operator", "deploying a fix", (NOW - timedelta(seconds=245)).timestamp())
FAILING = Pause("max_attempts", "RetryableError: db down", (NOW - timedelta(hours=2)).timestamp(), "01J0REQ")


def _render(renderable: object) -> str:
    console = Console(width=250, record=True)
    console.print(renderable)
    return console.export_text()


def test_a_pause_as_json_and_as_text() -> None:
    data = fmt.pause_json(FAILING, NOW, via="workspace")
    assert data == {
        "via": "workspace",
        "cause": "max_attempts",
        "reason": "RetryableError: db down",
        "since": "2026-01-02T01:04:05Z",
        "paused_seconds": 7200.0,
        "request_id": "01J0REQ",
    }
    assert fmt.pause_text(OPERATOR, NOW) == "for 4m05s (operator: deploying a fix)"
    assert (
        fmt.pause_text(FAILING, NOW) == "for 2h00m (max_attempts: RetryableError: db down, request 01J0REQ)"
    )
    assert fmt.pause_text(Pause("operator", "", OPERATOR.since), NOW) == "for 4m05s (operator)"


def _report(pause: Pause | None, workspace_pause: Pause | None) -> ChangeSetReport:
    record = RecordView(1, "d1", False, 0, {}, None, False, ())
    return ChangeSetReport(
        str(WK), str(CS), record, "none", 3, (), 0, now=NOW, pause=pause, workspace_pause=workspace_pause
    )


def test_change_set_show_says_whether_and_why_it_is_paused() -> None:
    idle = fmt_cs.change_set_json(_report(None, None))
    assert (idle["paused"], idle["pauses"]) == (False, [])
    assert "paused" not in _render(fmt_cs.change_set_view(_report(None, None)))

    both = fmt_cs.change_set_json(_report(FAILING, OPERATOR))
    assert both["paused"] and both["queued_total"] == 3
    assert [(p["via"], p["cause"], p["request_id"]) for p in both["pauses"]] == [
        ("change_set", "max_attempts", "01J0REQ"),
        ("workspace", "operator", None),
    ]
    text = _render(fmt_cs.change_set_view(_report(FAILING, OPERATOR)))
    assert "paused            for 2h00m (max_attempts: RetryableError: db down, request 01J0REQ)" in text
    assert "workspace paused  with its workspace, for 4m05s (operator: deploying a fix)" in text
    only_workspace = _render(fmt_cs.change_set_view(_report(None, OPERATOR)))
    assert "paused         with its workspace, for 4m05s (operator: deploying a fix)" in only_workspace


def test_a_change_set_no_daemon_holds_shows_its_last_owner_not_an_owner() -> None:
    # A paused (or idle) change set: no daemon holds it (docs/pausing.md); the record only says who held it last.
    let_go = _render(fmt_cs.change_set_view(_report(OPERATOR, None)))
    assert "last owner" in let_go and "d1 (epoch 1)" in let_go
    held = ChangeSetReport(str(WK), str(CS), _report(None, None).record, "owned", 0, (), 0, now=NOW)
    shown = _render(fmt_cs.change_set_view(held))
    assert "owner" in shown and "last owner" not in shown


def _status(pauses: tuple[PausedLine, ...], total: int, more: bool = False) -> StatusReport:
    return StatusReport(
        None,
        (StreamSummary("REBASER_REQUESTS", 6),),
        None,
        0,
        (),
        0,
        pauses=pauses,
        pauses_total=total,
        pauses_more=more,
    )


def test_status_lists_paused_change_sets_and_workspaces() -> None:
    none = _status((), 0)
    assert fmt.status_json(none, NOW)["pauses"] == [] and "paused: none" in _render(
        fmt.status_view(none, NOW)
    )

    lines = (
        PausedLine(str(WK), None, FAILING, queued=12),
        PausedLine(str(WK), str(CS), OPERATOR, queued=3),
    )
    data = fmt.status_json(_status(lines, 2), NOW)
    assert (data["pauses_total"], data["pauses_more"]) == (2, False)
    assert [(p["workspace_id"], p["change_set_id"], p["reason"], p["queued"]) for p in data["pauses"]] == [
        (str(WK), None, "RetryableError: db down", 12),
        (str(WK), str(CS), "deploying a fix", 3),
    ]
    text = _render(fmt.status_view(_status(lines, 2), NOW))
    assert "paused change sets and workspaces: 2" in text and "listed" not in text
    workspace_row = next(line for line in text.splitlines() if "(all)" in line)
    assert (
        "2h00m" in workspace_row
        and "max_attempts" in workspace_row
        and workspace_row.rstrip().endswith("12 │")
    )
    some = _render(fmt.status_view(_status(lines[:1], 10_000, more=True), NOW))
    assert "paused change sets and workspaces: 10000+ (the 1 oldest listed)" in some


def test_the_pause_commands_lines() -> None:
    fresh = PauseResult(str(WK), str(CS), OPERATOR, already=False, let_go=True)
    assert pause_line(fresh, NOW) == f"paused change set {WK}/{CS} (deploying a fix); no daemon holds it"
    kept = PauseResult(str(WK), None, FAILING, already=True, let_go=None)
    assert pause_line(kept, NOW) == (
        f"workspace {WK} was paused already, for 2h00m (max_attempts: RetryableError: db down, request 01J0REQ): "
        "that pause is kept; its owner lets it go at its next request boundary"
    )
    assert (
        pause_json(kept, NOW)["pause"]["request_id"] == "01J0REQ" and pause_json(kept, NOW)["already_paused"]
    )

    resumed = ResumeResult(str(WK), str(CS), OPERATOR, 1, 1, 0, workspace_pause=FAILING)
    first, note = resume_lines(resumed, NOW)
    assert (
        first
        == f"resumed change set {WK}/{CS} (paused for 4m05s (operator: deploying a fix)); gave it a task: "
        + ("a daemon takes it")
    )
    assert "its workspace is paused" in note and f"rebaser workspace resume {WK}" in note
    assert resume_json(resumed, NOW)["workspace_pause"]["cause"] == "max_attempts"
    assert resume_lines(ResumeResult(str(WK), str(CS), None, 0, 0, 0), NOW) == [
        f"change set {WK}/{CS} was not paused; nothing is queued"
    ]
    assert resume_lines(ResumeResult(str(WK), str(CS), None, 1, 0, 1), NOW)[0].endswith(
        "it has a task already"
    )

    workspace = ResumeResult(str(WK), None, OPERATOR, 10_005, 9_990, 10, left_to_sweep=5, still_paused=2)
    head, sweep, own = resume_lines(workspace, NOW)
    assert head.endswith("10005 change sets with requests queued: 9990 given a task, 10 had one")
    assert "5 change sets past the first 10000 get their task from the daemons' orphan sweep" in sweep
    assert own == "note: 2 change sets paused on their own stay paused"
    data = resume_json(workspace, NOW)
    assert (
        data["was"]["reason"] == "deploying a fix"
        and data["left_to_sweep"] == 5
        and data["change_set_id"] is None
    )

    skipped = SkipResult(str(WK), str(CS), "01J0REQ", 7, "REBASER_REQUESTS", 3, False, True)
    assert skip_line(skipped).startswith(
        "skipped request 01J0REQ (seq 7 of REBASER_REQUESTS): now dead letter 3"
    )
    again = SkipResult(str(WK), str(CS), "01J0REQ", 7, "REBASER_REQUESTS", 3, True, False)
    assert "(it had left the requests stream meanwhile): stored already as dead letter 3" in skip_line(again)
    assert skip_json(skipped)["dead_letter_seq"] == 3


def test_the_record_view_reads_the_shard_its_watermark_counts_in() -> None:
    record = ChangeSetRecord(epoch=1, owner="d", state={}, applied_seq=9, shard=2)
    view = RecordView.decode(record.encode())
    assert (view.applied_seq, view.shard) == (9, 2)


def test_a_dead_letter_copy_keeps_the_request_and_says_why() -> None:
    subjects = Subjects("p")
    subject = subjects.for_shard(2).requests(WK, CS)
    headers = {
        "Nats-Msg-Id": "x",
        "nats-expected-stream": "S",
        "X-Content-Type": "application/cbor",
        "X-Big": "v" * 2000,
    }
    kept, body = bounded_copy(headers, b"0123456789", max_body=4)
    assert kept == {
        "X-Content-Type": "application/cbor",
        h.DEAD_LETTER_HEADERS_DROPPED: "1",
        h.DEAD_LETTER_TRUNCATED: "10",
    }
    assert body == b"0123"
    assert bounded_copy({}, b"0123456789", max_body=10) == ({}, b"0123456789")
    marks = dead_letter_marks(subjects, subject, 41, "skipped by\nan operator \u2713")
    assert marks == {
        h.DEAD_LETTER_REASON: "skipped by an operator \\u2713",
        h.DEAD_LETTER_SUBJECT: subject,
        h.DEAD_LETTER_SEQUENCE: "41",
        h.NATS_MSG_ID: "p_REBASER_REQUESTS_2:41",  # the dedupe id names the shard's stream
    }
    assert dead_letter_subject(subjects, subject) == subjects.dead_letter(WK, CS)
    assert dead_letter_subject(subjects, "p.rebaser.requests.junk") == subjects.dead_letter_malformed
