"""The ``Rebaser-Events`` header (rebaser_core.api.event_window) and the record's window: written as the daemon
writes it, read back as a follower reads it, and anything else refused before it costs anything."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rebaser_core.api import EVENTS_HEADER, MAX_WINDOW, event_text, read_window, split_window, window_header
from rebaser_core.api.event_window import MAX_WINDOW_BYTES
from rebaser_core.errors import DecodeError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk, ulid_milliseconds
from rebaser_server.record.model import ChangeSetRecord

WK, CS = WorkspacePk.new(), ChangeSetId.new()


def _event(seq: int, **fields: Any) -> dict[str, Any]:
    return {
        "id": str(RequestId.new()),
        "workspace_id": str(WK),
        "change_set_id": str(CS),
        "kind": "applied",
        "durable": True,
        "at": time.time(),
        "epoch": 3,
        "seq": seq,
        "request_id": str(RequestId.new()),
        "status": "success",
        "updates_performed": 1,
        **fields,
    }


def test_a_window_reads_back_as_written() -> None:
    texts = [event_text(_event(seq)) for seq in (5, 6, 7)]
    value = window_header(texts, 2)
    assert value.isascii() and "\n" not in value and "\r" not in value  # a header value
    window = read_window(value, WK, CS)
    assert (window.new, window.last_seq) == (2, 7)
    assert [e.seq for e in window.events] == [5, 6, 7]
    assert split_window(value) == tuple(texts)


def test_a_window_event_is_short_and_what_it_leaves_out_is_put_back() -> None:
    event = {
        name: value for name, value in _event(1, queued=0).items() if name != "at"
    }  # the daemon's leave it out
    plain = json.loads(event_text(event))
    # Short names; no shared fields, no time, no status or kind an applied event's kind names, no queued 0.
    assert plain == {"id": event["id"], "e": 3, "n": 1, "r": event["request_id"], "u": 1}
    (read,) = read_window(window_header([event_text(event)], 1), WK, CS).events
    assert read.model_dump(mode="json") == {**event, "at": ulid_milliseconds(event["id"]) / 1000} | {
        name: None for name in ("snapshot_address", "conflicts", "reason", "duration_s", "error")
    } | {"settled": False, "owner": ""}


def test_what_an_event_leaves_out_is_put_back_and_what_it_says_is_kept() -> None:
    bare = {name: value for name, value in json.loads(event_text(_event(1))).items() if name != "t"}
    said = {**bare, "n": 2, "t": 12.5, "s": "error", "q": 4}
    dead = {**bare, "n": 3, "k": "dead_lettered", "y": "crashed"}
    value = window_header([json.dumps(e, separators=(",", ":")) for e in (bare, said, dead)], 3)
    bare_event, said_event, dead_event = read_window(value, WK, CS).events
    assert bare_event.at == ulid_milliseconds(bare["id"]) / 1000
    assert (bare_event.kind, bare_event.status, bare_event.queued) == ("applied", "success", 0)
    assert (said_event.at, said_event.status, said_event.queued) == (12.5, "error", 4)
    assert dead_event.status is None  # a dead letter's status is not its kind's: not put back
    assert (dead_event.kind, dead_event.reason, dead_event.queued) == ("dead_lettered", "crashed", 0)
    # Without its time, an event whose id is not a ULID does not read.
    broken = window_header([json.dumps({**bare, "id": "not-a-ulid"}, separators=(",", ":"))], 1)
    with pytest.raises(DecodeError):
        read_window(broken, WK, CS)
    # A field under its long name, where it has a short one, does not read (nor does one named twice).
    for long in ({**bare, "seq": 1}, {**bare, "kind": "applied"}, {**bare, "request_id": bare["r"]}):
        with pytest.raises(DecodeError, match="short one"):
            read_window(window_header([json.dumps(long)], 1), WK, CS)


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        "[]",
        '{"v":1,"new":0,"events":[]}',
        '{"v":3,"new":0,"events":[]}',
        '{"v":2,"new":"1","events":[]}',
        '{"v":2,"new":true,"events":[]}',
        '{"v":2,"new":2,"events":[]}',
        '{"v":2,"new":-1,"events":[]}',
        '{"v":2,"new":0,"events":{}}',
        '{"v":2,"new":1,"events":[1]}',
        "[" * 10_000 + "]" * 10_000,
    ],
)
def test_what_is_not_a_window_is_a_decode_error(value: str) -> None:
    with pytest.raises(DecodeError):
        read_window(value, WK, CS)
    assert split_window(value) == ()


def test_a_window_of_notices_holes_or_too_many_events_is_refused() -> None:
    notice = _event(4, kind="taken", durable=False)
    with pytest.raises(DecodeError, match="durable"):
        read_window(window_header([event_text(notice)], 0), WK, CS)
    with pytest.raises(DecodeError, match="one after another"):
        read_window(window_header([event_text(_event(1)), event_text(_event(3))], 0), WK, CS)
    many = [event_text(_event(seq)) for seq in range(1, MAX_WINDOW + 2)]
    with pytest.raises(DecodeError, match="out of bounds"):
        read_window(window_header(many, 0), WK, CS)


def test_a_value_longer_than_the_bound_is_refused_before_it_is_parsed() -> None:
    value = '{"v":2,"new":0,"events":[' + " " * MAX_WINDOW_BYTES + "]}"
    with pytest.raises(DecodeError, match="longer than"):
        read_window(value, WK, CS)


def test_the_record_carries_its_window_in_the_header_not_the_value() -> None:
    texts = tuple(event_text(_event(seq)) for seq in (1, 2))
    record = ChangeSetRecord(epoch=1, owner="d", state={}, events=2, feed=texts)
    headers = record.feed_header(1)
    assert headers is not None and json.loads(headers[EVENTS_HEADER])["new"] == 1
    assert EVENTS_HEADER.encode() not in record.encode() and texts[0].encode() not in record.encode()
    assert ChangeSetRecord.decode(record.encode(), headers).feed == texts
    assert ChangeSetRecord.decode(record.encode()).feed == ()
    # More new than the window holds (a window of 2, 5 decided by the write): the window's all.
    assert json.loads(record.feed_header(5)[EVENTS_HEADER])["new"] == 2  # type: ignore[index]
    assert ChangeSetRecord(epoch=1, owner="d", state={}).feed_header(0) is None


def test_a_window_that_is_not_the_records_is_not_carried_on() -> None:
    # A header whose last event is not the record's last (written by another hand): dropped, not carried on.
    texts = tuple(event_text(_event(seq)) for seq in (1, 2))
    stale = ChangeSetRecord(epoch=1, owner="d", state={}, events=2, feed=texts).feed_header(0)
    assert (
        ChangeSetRecord.decode(ChangeSetRecord(epoch=1, owner="d", state={}, events=5).encode(), stale).feed
        == ()
    )
    junk = {EVENTS_HEADER: "not json"}
    assert (
        ChangeSetRecord.decode(ChangeSetRecord(epoch=1, owner="d", state={}, events=2).encode(), junk).feed
        == ()
    )


def test_the_daemon_cuts_each_event_out_as_written_whatever_its_strings_hold() -> None:
    tricky = event_text(_event(2, snapshot_address='a"},{"x":[1]}]}\\u00e9'))
    texts = (event_text(_event(1)), tricky, event_text(_event(3)))
    assert split_window(window_header(texts, 1)) == texts
    assert split_window(window_header((), 0)) == ()
    # Not the form the daemon writes, but a window all the same: decoded whole.
    spaced = json.dumps({"v": 2, "new": 0, "events": [json.loads(t) for t in texts]})
    assert split_window(spaced) == texts
    # Cut short, or anything after the array: nothing carried on.
    whole = window_header(texts, 1)
    for broken in (whole[:-1], whole[:-2], whole + " ", whole.replace("},{", "} {", 1)):
        assert split_window(broken) == ()


def test_with_feed_is_replace_of_the_counter_and_the_window_every_field_kept() -> None:
    from dataclasses import fields, replace

    record = ChangeSetRecord(
        epoch=3,
        owner="d",
        state={"a": 1},
        dvu_pending=True,
        recent={"r": b"\x80"},
        attempts={"r": 2},
        applied_seq=9,
        task_seq=4,
        task_delivery=2,
        handed_back=True,
        reaped=True,
        suspect=(9, 1),
        shard=2,
        events=5,
        outbox=({"seq": 5},),
        events_at=11,
        last_error="E: x",
        feed=("a",),
    )
    assert len(fields(record)) == 18  # a new field is to be named in with_feed too
    assert record.with_feed(6, ("a", "b")) == replace(record, events=6, feed=("a", "b"))


def test_what_a_reader_is_told_of_a_window() -> None:
    texts = [event_text(_event(seq)) for seq in (5, 6, 7)]
    window = read_window(window_header(texts, 1), WK, CS)
    assert [e.seq for e in window.fresh(5, replay=False)] == [6, 7]
    assert [e.seq for e in window.fresh(None, replay=False)] == [7]
    assert [e.seq for e in window.fresh(None, replay=True)] == [5, 6, 7]
    assert window.fresh(7, replay=True) == []


def test_the_protocols_example_window_reads_as_the_protocol_says() -> None:
    # docs/protocol.md §17 is what a follower in another language reads the short form from: its example must hold.
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text()
    section = text[text.index("\n## 17. ") : text.index("\n### 17.1 ")]
    (value,) = re.findall(r"^Rebaser-Events: (\{.*\})$", section, re.MULTILINE)
    said = json.loads(section[section.index("```json\n", section.index(value)) + 8 :].split("\n```", 1)[0])
    wk, cs = said[0]["workspace_id"], said[0]["change_set_id"]
    events = read_window(value, wk, cs).events
    assert [event.model_dump(mode="json", exclude_defaults=True) for event in events] == said
