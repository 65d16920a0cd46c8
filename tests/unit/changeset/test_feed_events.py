"""What the feed stages for each kind of decision, checked against the wire model (the feed builds events as plain
dicts, not through the model, so this is where they are held to it). No NATS: nothing is published here."""

from __future__ import annotations

import json
from typing import Any

import pytest
from nats.aio.msg import Msg

from rebaser_core.api import (
    CHANGE_SET_EVENT,
    DURABLE_KINDS,
    EVENTS_HEADER,
    NOTICE_KINDS,
    Conflict,
    ConflictsStatus,
    ContentType,
    EnqueueUpdatesResponse,
    ErrorStatus,
    RefusedStatus,
    ResponseStatus,
    SuccessStatus,
    read_window,
)
from rebaser_core.api.codec import encode_body
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk, ulid_milliseconds
from rebaser_core.nats.requester import Requester
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.changeset import events
from rebaser_server.changeset.context import Stats
from rebaser_server.changeset.decisions import Decision, Kind
from rebaser_server.changeset.events import ChangeSetFeed
from rebaser_server.record.model import ChangeSetRecord

CS = ChangeSet(WorkspacePk.new(), ChangeSetId.new())


def _feed(*, enabled: bool = True, window: int = 0) -> ChangeSetFeed:
    return ChangeSetFeed(
        CS,
        requester=Requester(None),  # type: ignore[arg-type]  # never used: nothing is published
        subjects=Subjects(),
        owner="daemon-1",
        stats=Stats(),
        timeout=1,
        enabled=enabled,
        window=window,
    )


def _decision(status: ResponseStatus, dead_letter: str | None = None) -> Decision:
    response = EnqueueUpdatesResponse(
        id=RequestId.new(), workspace_id=CS.workspace_id, change_set_id=CS.change_set_id, status=status
    )
    msg = Msg(_client=None, subject="rebaser.requests.x.y", headers={"traceparent": "00-abc-def-01"})  # type: ignore[arg-type]
    record = ChangeSetRecord(epoch=1, owner="daemon-1", state={})
    return Decision(Kind.APPLIED, 5, msg, record, response, dead_letter=dead_letter)


def _valid(event: dict[str, Any]) -> Any:
    return CHANGE_SET_EVENT.current.model_validate(event, strict=False)


@pytest.mark.parametrize(
    ("status", "dead_letter", "kind", "fields"),
    [
        (
            SuccessStatus(updates_performed=3, snapshot_address="ab" * 32),
            None,
            "applied",
            {"updates_performed": 3},
        ),
        (
            ConflictsStatus(conflicts=[Conflict(path="/a", expected_version="1", actual_version="2")] * 2),
            None,
            "conflicts",
            {"conflicts": 2},
        ),
        (RefusedStatus(message="no"), None, "refused", {"status": "refused"}),
        (ErrorStatus(message="x", retryable=False), None, "error_reply", {"status": "error"}),
        (
            ErrorStatus(message="gave up after 3 attempts: RuntimeError: x", retryable=False),
            "gave up after 3 attempts: RuntimeError: x",
            "dead_lettered",
            {"reason": "max_attempts"},
        ),
    ],
)
def test_each_outcome_is_its_kind_of_event(
    status: ResponseStatus, dead_letter: str | None, kind: str, fields: dict[str, Any]
) -> None:
    feed = _feed()
    record = ChangeSetRecord(epoch=1, owner="daemon-1", state={}, events=4)
    staged = feed.stage(record, [_decision(status, dead_letter)], [0], settled=True)
    assert staged.events == 5
    (event_dict,) = staged.outbox
    event = _valid(dict(event_dict))
    assert (event.kind, event.seq, event.durable, event.settled) == (kind, 5, True, True)
    assert event.owner == "" and event.request_id is not None  # the owner is told by the notices
    for name, value in fields.items():
        assert getattr(event, name) == value
    # The encoded form is what followers decode.
    headers = {"X-MESSAGE-TYPE": "ChangeSetEvent", "X-MESSAGE-VERSION": "1"}
    assert CHANGE_SET_EVENT.decode(headers, encode_body(dict(event_dict), ContentType.CBOR)) == event


@pytest.mark.parametrize(
    ("status", "dead_letter"),
    [
        (SuccessStatus(updates_performed=3, snapshot_address='ab"\\\u00e9' * 200), None),
        (SuccessStatus(updates_performed=0), None),
        (
            ConflictsStatus(conflicts=[Conflict(path="/a", expected_version="1", actual_version="2")] * 2),
            None,
        ),
        (RefusedStatus(message="no"), None),
        (ErrorStatus(message="x", retryable=False), None),
        (
            ErrorStatus(message="x", retryable=False),
            "gave up after 3 attempts: every daemon that took this died",
        ),
    ],
)
def test_the_window_written_straight_is_the_window_the_dicts_make(
    status: ResponseStatus, dead_letter: str | None
) -> None:
    # With the events stream off, the window's texts are written without the events' dicts (event_texts.py): the
    # same events, field for field, but for their own ids and times.
    decisions = [_decision(status, dead_letter), _decision(status, dead_letter)]

    def window_of(enabled: bool) -> list[Any]:
        feed = _feed(enabled=enabled, window=4)
        record = ChangeSetRecord(epoch=7, owner="daemon-1", state={}, events=4)
        staged = feed.stage(record, decisions, [1, 0], settled=True)
        staged = feed.stage_dvu(staged, 0.25, settled=False)
        value = staged.feed_header(3)[EVENTS_HEADER]  # type: ignore[index]
        return list(read_window(value, CS.workspace_id, CS.change_set_id).events)

    straight, from_dicts = window_of(False), window_of(True)
    assert [e.seq for e in straight] == [5, 6, 7]
    for one, other in zip(straight, from_dicts, strict=True):
        assert one.model_dump(exclude={"id", "at"}) == other.model_dump(exclude={"id", "at"})
        # Written without its time, read back as the id's millisecond.
        assert one.at == ulid_milliseconds(str(one.id)) / 1000
    assert [e.settled for e in straight] == [False, True, False]


def test_the_window_written_straight_leaves_out_what_the_reader_puts_back() -> None:
    # Its time (the id's millisecond), an applied event's kind, but for a dead letter its status (the kind's), and
    # nothing queued: fewer bytes on every write of the record, and the reader's events as above.
    feed = _feed(enabled=False, window=4)
    record = ChangeSetRecord(epoch=7, owner="daemon-1", state={})
    outcomes = [
        _decision(SuccessStatus(updates_performed=1, snapshot_address="ab")),
        _decision(ErrorStatus(message="x", retryable=False)),
        _decision(ErrorStatus(message="x", retryable=False), "DecodeError: bad"),
    ]
    staged = feed.stage_dvu(feed.stage(record, outcomes, [0, 0, 0], settled=False), 0.5, settled=True)
    events = [json.loads(text) for text in staged.feed]
    assert [e.get("k") for e in events] == [None, "error_reply", "dead_lettered", "dvu_finished"]
    assert all("t" not in e and "q" not in e for e in events)  # no time, nothing queued
    assert ["s" in e for e in events] == [False, False, True, False]


def test_a_group_numbers_its_events_and_only_the_last_says_settled() -> None:
    feed = _feed()
    record = ChangeSetRecord(epoch=1, owner="daemon-1", state={}, events=0)
    decisions = [_decision(SuccessStatus(updates_performed=1)) for _ in range(3)]
    staged = feed.stage(record, decisions, [2, 1, 0], settled=True)
    events = [_valid(dict(e)) for e in staged.outbox]
    assert [e.seq for e in events] == [1, 2, 3]
    assert [e.queued for e in events] == [2, 1, 0]
    assert [e.settled for e in events] == [False, False, True]
    assert [str(e.request_id) for e in events] == [str(d.response.id) for d in decisions if d.response]
    # Not committed: dropped, nothing is carried into the next commit.
    feed.dropped()
    again = feed.stage(record, [], [], settled=False)
    assert again.outbox == () and again.events == 0


@pytest.mark.parametrize("kind", sorted(DURABLE_KINDS | NOTICE_KINDS))
def test_every_kind_the_feed_builds_is_a_valid_event(kind: str) -> None:
    event = _feed()._event(kind, duration_s=0.5)  # type: ignore[arg-type]
    event["seq"] = 0
    assert _valid(event).durable is (kind in DURABLE_KINDS)


def test_a_disabled_feed_stages_nothing() -> None:
    feed = _feed()
    feed.enabled = False
    record = ChangeSetRecord(epoch=1, owner="daemon-1", state={})
    assert feed.stage(record, [_decision(SuccessStatus(updates_performed=1))], [0], settled=True) is record


async def test_the_outbox_keeps_at_most_outbox_max_events_unconfirmed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Events are queued faster than the stream confirms them (an outage): past OUTBOX_MAX the oldest are given up,
    # in the daemon's memory and in the next record's outbox alike (a follower sees the gap in seq).
    monkeypatch.setattr(events, "OUTBOX_MAX", 4)
    feed = _feed()
    queued = _queued(feed, monkeypatch)  # and never confirmed
    record = ChangeSetRecord(epoch=1, owner="daemon-1", state={})
    for _ in range(10):
        record = feed.stage(record, [_decision(SuccessStatus(updates_performed=1))], [0], settled=False)
        await feed.committed()
        assert (
            len(feed._unconfirmed) <= 4 and len(record.outbox) <= 5
        )  # (staged: the last 4, and the new one)
    assert list(feed._unconfirmed) == [7, 8, 9, 10] and queued == list(range(1, 11))


async def test_a_record_found_stored_after_all_has_its_events_queued_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A commit got no answer and was dropped (its staged events with it); read back later, it was stored: its
    # events are queued then, once, and the next ones are numbered after them.
    feed = _feed()
    queued = _queued(feed, monkeypatch)
    base = ChangeSetRecord(epoch=1, owner="daemon-1", state={})
    first = feed.stage(base, [_decision(SuccessStatus(updates_performed=1))], [0], settled=False)
    await feed.committed()
    lost = feed.stage(first, [_decision(SuccessStatus(updates_performed=1))] * 2, [1, 0], settled=False)
    feed.dropped()  # the commit raised: its answer was lost
    await feed.adopted(lost)  # read back before the next write: it was stored
    await feed.adopted(lost)  # (twice: nothing more)
    assert queued == [1, 2, 3]
    after = feed.stage(lost, [_decision(SuccessStatus(updates_performed=1))], [0], settled=False)
    assert after.events == 4


def _queued(feed: ChangeSetFeed, monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """The seqs of what ``feed`` queues for publishing, from now on (nothing is published)."""
    queued: list[int | None] = []

    async def put(*items: Any) -> None:
        queued.extend(item.seq for item in items)

    monkeypatch.setattr(feed._pump, "put", put)
    return queued


async def test_the_window_keeps_the_last_events_on_the_record_and_a_dropped_commit_none() -> None:
    feed = ChangeSetFeed(
        CS,
        requester=Requester(None),  # type: ignore[arg-type]  # never used: the events stream is off
        subjects=Subjects(),
        owner="daemon-1",
        stats=Stats(),
        timeout=1,
        enabled=False,
        window=3,
    )
    record = ChangeSetRecord(epoch=1, owner="daemon-1", state={})
    feed.taken(record)
    for _ in range(2):
        decisions = [_decision(SuccessStatus(updates_performed=1)) for _ in range(2)]
        record = feed.stage(record, decisions, [1, 0], settled=True)
        await feed.committed()
    assert record.events == 4 and record.outbox == ()
    window = read_window(record.feed_header(0)[EVENTS_HEADER], CS.workspace_id, CS.change_set_id).events  # type: ignore[index]
    assert [e.seq for e in window] == [2, 3, 4] and window[-1].settled and not window[1].settled
    # A commit that is dropped (fenced, failed) changes nothing the next stage builds on.
    staged = feed.stage(record, [_decision(SuccessStatus(updates_performed=1))], [0], settled=True)
    assert staged.events == 5
    feed.dropped()
    again = feed.stage(record, [_decision(SuccessStatus(updates_performed=1))], [0], settled=True)
    assert again.events == 5 and [json.loads(t)["n"] for t in again.feed] == [3, 4, 5]
