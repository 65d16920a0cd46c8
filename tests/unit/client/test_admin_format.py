"""The admin commands' pure parts: the record as operators read it, replay ids, JSON and tables."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from rebaser_client._record import RecordView
from rebaser_client.admin import format as fmt
from rebaser_client.admin import format_change_set as fmt_cs
from rebaser_client.admin.change_set import ChangeSetReport, QueuedRequest
from rebaser_client.admin.dead_letters import DeadLetter
from rebaser_client.admin.reader import StreamSummary
from rebaser_client.admin.repairs import replay_id
from rebaser_client.admin.status import ChangeSetLine, StatusReport
from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    ContentType,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    ErrorStatus,
    InlineUpdates,
    SetLiteral,
    SuccessStatus,
)
from rebaser_core.errors import DecodeError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_server.record.model import ChangeSetRecord

WK, CS = WorkspacePk.new(), ChangeSetId.new()
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _response(rid: RequestId, status: SuccessStatus | ErrorStatus) -> EnqueueUpdatesResponse:
    return EnqueueUpdatesResponse(id=rid, workspace_id=WK, change_set_id=CS, status=status)


def test_record_view_reads_what_the_daemon_writes() -> None:
    ok, bad = RequestId.new(), RequestId.new()
    record = ChangeSetRecord(
        epoch=7,
        owner="host:1:abc",
        state={"anything": [1, 2]},
        dvu_pending=True,
        attempts={"X": 2},
        applied_seq=41,
        suspect=(42, 1),
        handed_back=True,
    )
    record = record.with_reply(str(ok), _response(ok, SuccessStatus(updates_performed=3)), 64)
    record = record.with_reply(str(bad), _response(bad, ErrorStatus(message="boom", retryable=False)), 64)
    view = RecordView.decode(replace(record, attempts={"X": 2}).encode())
    assert (view.epoch, view.owner, view.dvu_pending, view.applied_seq) == (7, "host:1:abc", True, 41)
    assert (dict(view.attempts), view.suspect, view.handed_back) == ({"X": 2}, (42, 1), True)
    assert [(r.request_id, r.kind, r.detail) for r in view.recent] == [
        (str(ok), "success", "3 updates"),
        (str(bad), "error", "boom"),
    ]
    assert view.recent[0].at == ok.ulid.datetime


def test_a_record_that_is_not_one_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        RecordView.decode(b"\xff\x00garbage")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0.42, "0.4s"),
        (12.9, "12s"),
        (245, "4m05s"),
        (7380, "2h03m"),
        (3 * 86400 + 4 * 3600, "3d04h"),
    ],
)
def test_human_age(seconds: float | None, text: str) -> None:
    assert fmt.human_age(seconds) == text


def _letter(seq: int = 5, data: bytes = b"", headers: dict[str, str] | None = None) -> DeadLetter:
    return DeadLetter(
        seq=seq,
        time=NOW,
        subject=f"rebaser.requests.{WK}.{CS}",
        original_seq=9,
        reason="UnprocessableError: no",
        request_id="01J00000000000000000000000",
        workspace_id=str(WK),
        change_set_id=str(CS),
        size=len(data),
        truncated=None,
        headers=headers or {},
        data=data,
    )


def test_a_replay_id_is_derived_from_the_dead_letter() -> None:
    first = replay_id(_letter(5), "REBASER_DEAD_LETTERS")
    assert first == replay_id(_letter(5), "REBASER_DEAD_LETTERS")  # the same dead letter: the same attempt
    assert first != replay_id(_letter(6), "REBASER_DEAD_LETTERS")
    assert first != replay_id(_letter(5), "P_REBASER_DEAD_LETTERS")
    assert first.ulid.datetime == NOW.replace(microsecond=0)


def test_dead_letter_json_shows_the_request_or_its_raw_body() -> None:
    request = EnqueueUpdatesRequest(
        id=RequestId.new(),
        workspace_id=WK,
        change_set_id=CS,
        updates=InlineUpdates(updates=[SetLiteral(path="/a", value=1)]),
    )
    headers, body = ENQUEUE_UPDATES_REQUEST.encode(request, ContentType.JSON)
    headers.pop("Nats-Msg-Id")
    letter = _letter(data=body, headers={**headers, "X-Rebaser-Dead-Letter-Reason": "r", "Nats-Stream": "S"})
    full = fmt.dead_letter_json(letter, full=True)
    assert full["request"]["id"] == str(request.id)
    assert "X-Rebaser-Dead-Letter-Reason" not in full["headers"] and "Nats-Stream" not in full["headers"]
    garbled = fmt.dead_letter_json(_letter(data=b"\x00not a request", headers=headers), full=True)
    assert garbled["request"] is None and garbled["body_text"] == "\x00not a request"


def _render(renderable: object) -> str:
    console = Console(width=250, record=True)
    console.print(renderable)
    return console.export_text()


def test_change_set_report_as_json_and_table() -> None:
    rid = RequestId.new()
    record = RecordView(3, "d1", True, 10, {str(rid): 2}, None, False, ())
    queued = (
        QueuedRequest(10, "01J00000000000000000000001", NOW - timedelta(seconds=90), 100, "1 updates", True),
        QueuedRequest(11, str(rid), NOW - timedelta(seconds=5), 120, "2 updates", False, attempts=2),
    )
    report = ChangeSetReport(str(WK), str(CS), record, "owned", 2, queued, 1, now=NOW)
    data = fmt_cs.change_set_json(report)
    assert data["record"]["epoch"] == 3 and data["task"] == "owned" and data["dead_letters"] == 1
    assert [q["age_seconds"] for q in data["queued"]] == [90.0, 5.0]
    text = _render(fmt_cs.change_set_view(report))
    assert "d1 (epoch 3)" in text and "1m30s" in text and "processed, awaiting purge" in text
    assert "queued, 2 failed attempts" in text


def test_status_lists_owners_of_owned_change_sets() -> None:
    lines = (
        ChangeSetLine("W", "A", 5, "owned", 0, owner="d1", epoch=1, dvu_pending=False),
        ChangeSetLine("W", "B", 1, "owned", 0, owner="d1", epoch=2, dvu_pending=True),
        ChangeSetLine("W", "C", 0, "none", 2, owner="d2", epoch=1, dvu_pending=False),
    )
    report = StatusReport(
        None, (StreamSummary("REBASER_REQUESTS", 6), StreamSummary("X", None)), None, 3, lines, 4
    )
    assert report.owners == {"d1": 2}
    data = fmt.status_json(report)
    assert data["streams"][1]["exists"] is False and data["change_sets_total"] == 4
    text = _render(fmt.status_view(report))
    assert "missing" in text and "the 3 busiest listed" in text


def test_an_empty_stream_and_the_default_prefix_read_as_such() -> None:
    streams = (
        StreamSummary("REBASER_REQUESTS", 0, 0, first_seq=7, last_seq=6),  # held 6 messages, all gone
        StreamSummary("REBASER_TASKS", 0),  # never held one
        StreamSummary("REBASER_DEAD_LETTERS", 2, 300, first_seq=3, last_seq=4),
    )
    text = _render(fmt.status_view(StatusReport(None, streams, None, 0, (), 0)))
    assert "empty (next 7)" in text and "empty (next 1)" in text and "3..4" in text
    assert "7..6" not in text
    assert "streams (no prefix: the default names)" in text and "prefix -" not in text
    assert "streams (prefix t42)" in _render(fmt.status_view(StatusReport("t42", streams, None, 0, (), 0)))


@pytest.mark.parametrize(
    ("text", "width", "shown"),
    [
        ("short reason", 120, "short reason"),
        ("UnprocessableError: the quantity is negative", 30, "UnprocessableError: the…"),
        ("word " * 40, 24, "word word word word…"),
        ("a" * 50, 20, "a" * 19 + "…"),  # one word longer than the width: cut inside it
        ("line one\nline two", 120, "line one line two"),
    ],
)
def test_a_long_reason_is_cut_at_a_word_with_an_ellipsis(text: str, width: int, shown: str) -> None:
    assert fmt.shorten(text, width) == shown
    assert len(fmt.shorten(text, width)) <= width


def test_the_dead_letter_table_cuts_reasons_between_words() -> None:
    reason = "UnprocessableError: " + " ".join(f"word{n}" for n in range(60))
    text = _render(fmt.dead_letters_view(1, [replace(_letter(), reason=reason)], NOW))
    shown = next(line for line in text.splitlines() if "UnprocessableError" in line)
    assert "…" in shown
    cut = shown[shown.index("UnprocessableError") :].split("…")[0]
    assert cut.split()[-1] in {f"word{n}" for n in range(60)}  # the last word shown is whole


@pytest.mark.parametrize(
    ("count", "text"), [(0, "0 dead letters"), (1, "1 dead letter"), (2, "2 dead letters")]
)
def test_counts_agree_with_their_noun(count: int, text: str) -> None:
    from rebaser_client.admin.cli.common import plural

    assert plural(count, "dead letter") == text
