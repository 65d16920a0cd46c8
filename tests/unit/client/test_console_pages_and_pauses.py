"""Issue 64's pure parts (no server): who made a pause, kept in its entry without breaking older ones; the last
retryable failure kept in the record; what the console's pages say (a last owner as such, the last error escaped and
bounded, the dead letters' count with their list, stale data as stale); its cookie and identities; the URL it
prints; ``rebaser status``'s owners as true totals."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from rebaser_client._record import RecordView
from rebaser_client.admin.change_set import ChangeSetReport
from rebaser_client.admin.cli.console import serving_line
from rebaser_client.admin.console.guard import cookie_value, identity_of
from rebaser_client.admin.console.index import STATES, Filter, Index, Row
from rebaser_client.admin.console.pages import list_counts, overview_body, row_data
from rebaser_client.admin.console.pages_detail import change_set_detail, dead_letters_body, dead_letters_part
from rebaser_client.admin.format import pause_json, pause_text
from rebaser_client.admin.reader import StreamSummary
from rebaser_client.admin.status import ChangeSetLine, StatusReport
from rebaser_client.admin.workspaces import DaemonLine, DaemonsOwned
from rebaser_core.pauses import Pause
from rebaser_server.record.model import LAST_ERROR_MAX, ChangeSetRecord

WK, CS = "01J0000000000000000000WK01", "01J00000000000000000000C01"


# -- a pause says who made it ----------------------------------------------------------------------------------------
def test_a_pause_keeps_who_made_it_and_reads_entries_without_it() -> None:
    pause = Pause.now("operator", "deploying", by="token:0123456789ab")
    assert Pause.decode(pause.encode()).by == "token:0123456789ab"
    # An entry that does not say who is the same bytes as before the field existed, and reads as such.
    old = b'{"cause":"operator","reason":"deploying","since":1.5,"request_id":null}'
    assert Pause("operator", "deploying", 1.5).encode() == old
    assert Pause.decode(old) == Pause("operator", "deploying", 1.5)
    now = datetime.now(UTC)
    assert "by token:0123456789ab" in pause_text(pause, now)
    assert pause_json(pause, now)["by"] == "token:0123456789ab"
    assert "by" not in pause_json(Pause.decode(old), now)


# -- the record keeps the last retryable failure ----------------------------------------------------------------------
def test_the_record_keeps_the_last_failure_while_a_request_is_retried() -> None:
    record = ChangeSetRecord(epoch=1, owner="d1", state={}, attempts={"R1": 2}, last_error="KeyError: 'x'")
    back = ChangeSetRecord.decode(record.encode())
    assert back.last_error == "KeyError: 'x'" and back.attempts == {"R1": 2}
    assert RecordView.decode(record.encode()).last_error == "KeyError: 'x'"
    # None: not stored at all (an older daemon's record reads the same).
    assert b"last_error" not in ChangeSetRecord(epoch=1, owner="d1", state={}).encode()
    assert LAST_ERROR_MAX <= 300


# -- the pages -------------------------------------------------------------------------------------------------------
def test_a_list_row_says_whether_its_owner_holds_it_now() -> None:
    row = Row(WK, CS, owner="d1", task="none")
    assert row_data(row, ())[3:] == ["d1", 0, None, 0, False]  # the daemon that held it last, not its owner
    row.task = "owned"
    assert row_data(row, ("running",))[-1] is True


def test_the_state_counts_go_with_the_list_and_an_unknown_state_is_refused() -> None:
    index = Index()
    index.apply_counts({(WK, CS): {"queued": 1}})
    index.apply_pause(WK, CS, Pause("operator", "", 0.0))
    assert list_counts(index) == {"": 1, **dict.fromkeys(STATES, 0), "queued": 1, "paused": 1}
    assert Filter.unknown_state({"state": "bogus"}) == "bogus"
    assert Filter.unknown_state({"state": "paused"}) is None and Filter.unknown_state({}) is None


def _report(task: str, record: RecordView | None) -> ChangeSetReport:
    return ChangeSetReport(WK, CS, record, task, 1, (), 0)


def test_a_change_set_page_shows_its_last_owner_and_its_last_error_escaped_and_bounded() -> None:
    error = "RuntimeError: <script>alert(1)</script> " + "x" * 1000
    record = RecordView(2, "d1", False, 0, {"R1": 3}, None, False, (), last_error=error[:300])
    idle = change_set_detail(WK, CS, _report("none", record), None, ("retrying",), read_only=True)
    assert "<th>last owner</th>" in idle and "<th>owner</th>" not in idle
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in idle and "<script>" not in idle
    assert "x" * 400 not in idle
    held = change_set_detail(WK, CS, _report("owned", record), None, ("running",), read_only=True)
    assert "<th>owner</th>" in held
    # No failure counted: no last error shown.
    calm = RecordView(2, "d1", False, 0, {}, None, False, (), last_error="")
    assert "last error" not in change_set_detail(WK, CS, _report("owned", calm), None, (), read_only=True)


def test_the_dead_letters_count_and_buttons_are_in_the_part_kept_live() -> None:
    part = dead_letters_part(12, [], {}, read_only=False)
    assert "Replay these 12" in part and "12 dead letters" in part
    body = dead_letters_body(12, [], {}, read_only=False)
    # The live update replaces #dead-letters whole: the count and the buttons are inside it, once.
    inside = body.split('<div id="dead-letters">', 1)[1]
    assert body.count("Replay these 12") == 1 and "Replay these 12" in inside and "12 dead letters" in inside


def _status(daemons: DaemonsOwned | None = None, owners: dict[str, int] | None = None) -> StatusReport:
    return StatusReport(
        None,
        (StreamSummary("REBASER_REQUESTS", 0), StreamSummary("REBASER_TASKS", 0), StreamSummary("DLQ", 0)),
        None,
        0,
        (ChangeSetLine(WK, CS, 1, "owned", 0, owner="d1"),),
        202,
        daemons=daemons or DaemonsOwned({}, 0),
        owners_counted=owners,
    )


def test_the_overview_shows_stale_data_as_stale_and_the_daemons_as_last_read() -> None:
    ready = DaemonsOwned({}, 1, daemons=(DaemonLine("http://d1:9464", owner="d1", ready=True),))
    gone = DaemonsOwned(
        {}, 0, ("http://d1:9464: refused",), daemons=(DaemonLine("http://d1:9464", problem="down"),)
    )
    live = overview_body(_status(ready), None, Index(), True, daemons=ready)
    assert "Stale" not in live and "ready" in live
    stale = overview_body(_status(ready), None, Index(), True, daemons=gone, stale_since=1_700_000_000.0)
    assert "Stale: the console cannot read NATS" in stale and 'data-since="1700000000.000"' in stale
    assert "ready" not in stale and "down" in stale  # the daemons' health read on its own, not the report's


def test_status_owners_are_the_true_totals() -> None:
    assert _status(owners={"d1": 202}).owners == {"d1": 202}  # counted over every change set with a task
    assert _status().owners == {"d1": 1}  # not counted: those listed


# -- the guard and the command line -------------------------------------------------------------------------------
def test_the_cookie_holds_a_derived_value_and_identities_give_no_token_away() -> None:
    token = "a-token-of-enough-characters"
    assert cookie_value(token) != token and token not in cookie_value(token)
    assert cookie_value(token) == cookie_value(token) != cookie_value(token + "!")
    identity = identity_of(token)
    assert identity.startswith("token:") and token not in identity and identity != identity_of(token + "!")
    assert identity_of(None) == "local"
    json.dumps(identity)


def test_the_printed_url_can_be_opened() -> None:
    line = serving_line("0.0.0.0", 8470)
    assert line.startswith("http://127.0.0.1:8470/") and "listening on all interfaces" in line
    assert "0.0.0.0:8470" not in line
    assert serving_line("::", 8470).startswith("http://[::1]:8470/")
    assert serving_line("127.0.0.1", 8470) == "http://127.0.0.1:8470/"
