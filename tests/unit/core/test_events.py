"""The change-set event as a wire message: versioned, bounded, the durable flag tied to the kind, the reason class."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rebaser_core import headers as h
from rebaser_core.api import (
    CHANGE_SET_EVENT,
    DURABLE_KINDS,
    MAX_EVENT_BYTES,
    NOTICE_KINDS,
    ChangeSetEvent,
    ContentType,
    event_msg_id,
    reason_class,
)
from rebaser_core.errors import DecodeError, UnsupportedMessageVersion
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk


def _event(**fields: object) -> ChangeSetEvent:
    base: dict[str, object] = {
        "id": RequestId.new(),
        "workspace_id": WorkspacePk.new(),
        "change_set_id": ChangeSetId.new(),
        "kind": "applied",
        "seq": 1,
        "durable": True,
        "at": 1_700_000_000.5,
    }
    return ChangeSetEvent(**{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize("content_type", list(ContentType))
def test_an_event_round_trips_with_its_headers(content_type: ContentType) -> None:
    event = _event(
        request_id=RequestId.new(), status="success", updates_performed=3, snapshot_address="ab" * 32
    )
    headers, body = CHANGE_SET_EVENT.encode(event, content_type)
    assert headers[h.MESSAGE_TYPE] == "ChangeSetEvent" and headers[h.MESSAGE_VERSION] == "1"
    assert CHANGE_SET_EVENT.decode(headers, body) == event


def test_the_largest_event_stays_under_the_bound() -> None:
    longest = "x" * 128
    event = _event(
        kind="dead_lettered",
        seq=2**53,
        epoch=2**53,
        owner=longest,
        request_id=RequestId.new(),
        status="error",
        updates_performed=2**53,
        snapshot_address="y" * 512,
        conflicts=2**53,
        reason=longest,
        duration_s=1e9,
        error=longest,
    )
    for content_type in ContentType:
        assert len(CHANGE_SET_EVENT.encode(event, content_type)[1]) < MAX_EVENT_BYTES // 2


def test_fields_past_their_bounds_are_refused() -> None:
    with pytest.raises(ValidationError):
        _event(owner="x" * 129)
    with pytest.raises(ValidationError):
        _event(snapshot_address="y" * 513)
    with pytest.raises(ValidationError):
        _event(seq=-1)


@pytest.mark.parametrize("kind", sorted(DURABLE_KINDS | NOTICE_KINDS))
def test_durable_is_the_kinds_own(kind: str) -> None:
    durable = kind in DURABLE_KINDS
    assert _event(kind=kind, durable=durable).durable is durable
    with pytest.raises(ValidationError, match="durable"):
        _event(kind=kind, durable=not durable)


def test_hostile_bodies_are_typed_errors() -> None:
    headers = {h.MESSAGE_TYPE: "ChangeSetEvent", h.MESSAGE_VERSION: "1"}
    for body in (b"", b"\xff\xff", b"\x9f" * 10_000, b"{}"):
        with pytest.raises(DecodeError):
            CHANGE_SET_EVENT.decode(headers, body)
    with pytest.raises(UnsupportedMessageVersion):
        CHANGE_SET_EVENT.decode({h.MESSAGE_TYPE: "ChangeSetEvent", h.MESSAGE_VERSION: "2"}, b"")


def test_the_msg_id_names_the_change_set_and_the_seq() -> None:
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    assert event_msg_id(wk, cs, 7) == f"ev.{wk}.{cs}.7"
    assert event_msg_id(wk, cs, 7) != event_msg_id(wk, cs, 8)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (
            "gave up after 3 attempts: every daemon that took this request died or froze before finishing it",
            "crashed",
        ),
        ("gave up after 5 attempts: RuntimeError: boom", "max_attempts"),
        ("gave up after 5 attempts: RuntimeError: the worker died or froze", "max_attempts"),
        ("DecodeError: body is not valid application/cbor", "DecodeError"),
        ("UnprocessableError: request for X was published on Y", "UnprocessableError"),
        ("a request body a user wrote: with a colon", "other"),
        ("", "other"),
    ],
)
def test_a_dead_letter_reason_is_told_by_its_class_only(reason: str, expected: str) -> None:
    assert reason_class(reason) == expected
