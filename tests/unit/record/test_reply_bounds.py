"""Replies have a bounded size, so they always fit in a NATS message and in the change set's record."""

from __future__ import annotations

import cbor2

from rebaser_core.api import (
    ENQUEUE_UPDATES_RESPONSE,
    Conflict,
    ConflictsStatus,
    ContentType,
    EnqueueUpdatesResponse,
    ErrorStatus,
    SuccessStatus,
)
from rebaser_core.api.enqueue_updates_response import (
    MAX_ERROR_MESSAGE_CHARS,
    MAX_LISTED_CONFLICTS,
    MAX_STATUS_BYTES,
)
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_server.record.model import ChangeSetRecord

NATS_MAX_PAYLOAD = 1024 * 1024


def conflicts(n: int, path_chars: int = 10) -> list[Conflict]:
    return [
        Conflict(
            path=f"/p{i}".ljust(path_chars, "x"),
            expected_version="0" * 16,
            actual_version="1" * 16,
            message="changed",
        )
        for i in range(n)
    ]


def response(status: SuccessStatus | ConflictsStatus | ErrorStatus) -> EnqueueUpdatesResponse:
    return EnqueueUpdatesResponse(
        id=RequestId.new(), workspace_id=WorkspacePk.new(), change_set_id=ChangeSetId.new(), status=status
    )


def encoded_size(status: SuccessStatus | ConflictsStatus | ErrorStatus) -> int:
    return len(ENQUEUE_UPDATES_RESPONSE.encode(response(status), ContentType.JSON)[1])


def test_20000_conflicts_are_listed_up_to_the_bound_with_a_count_of_the_rest() -> None:
    status = ConflictsStatus(conflicts=conflicts(20_000))
    assert len(status.conflicts) == MAX_LISTED_CONFLICTS
    assert [c.path for c in status.conflicts] == [c.path for c in conflicts(MAX_LISTED_CONFLICTS)]
    assert status.conflicts[-1].message.endswith(
        f"(and {20_000 - MAX_LISTED_CONFLICTS} more conflicts not listed)"
    )
    assert encoded_size(status) <= MAX_STATUS_BYTES + 1024


def test_long_paths_list_fewer_conflicts_but_always_the_first() -> None:
    status = ConflictsStatus(conflicts=conflicts(500, path_chars=1024))
    assert 1 <= len(status.conflicts) < MAX_LISTED_CONFLICTS
    assert status.conflicts[0].path.startswith("/p0")
    assert "more conflicts not listed" in status.conflicts[-1].message
    assert encoded_size(status) <= MAX_STATUS_BYTES + 1024


def test_a_conflicts_reply_decoded_from_the_wire_is_bounded_too() -> None:
    unbounded = {"kind": "conflicts", "conflicts": [c.model_dump(mode="json") for c in conflicts(5_000)]}
    status = ConflictsStatus.model_validate(unbounded)
    assert len(status.conflicts) == MAX_LISTED_CONFLICTS


def test_small_statuses_are_unchanged() -> None:
    few = conflicts(3)
    assert ConflictsStatus(conflicts=few).conflicts == few
    assert ErrorStatus(message="boom").message == "boom"


def test_an_error_message_is_cut() -> None:
    status = ErrorStatus(message="x" * 1_000_000)
    assert len(status.message) == MAX_ERROR_MESSAGE_CHARS and status.message.endswith("…")


def test_a_record_of_64_largest_replies_fits_in_a_nats_message() -> None:
    record = ChangeSetRecord(epoch=1, owner="o", state={"snapshot": "0" * 64})
    many = conflicts(20_000, path_chars=200)
    for _ in range(32):
        big = response(ConflictsStatus(conflicts=many))
        record = record.with_reply(str(big.id), big, 64)
        error = response(ErrorStatus(message="é" * 100_000))
        record = record.with_reply(str(error.id), error, 64)
    assert len(record.recent) == 64
    assert len(record.encode()) < NATS_MAX_PAYLOAD * 3 // 4


def test_a_wide_idempotency_window_stores_each_reply_smaller() -> None:
    record = ChangeSetRecord(epoch=1, owner="o", state=None)
    many = conflicts(20_000, path_chars=100)
    replies = [response(ConflictsStatus(conflicts=many)) for _ in range(512)]
    for reply in replies:
        record = record.with_reply(str(reply.id), reply, 512)
    assert len(record.encode()) < NATS_MAX_PAYLOAD
    stored = cbor2.loads(record.recent[str(replies[0].id)])[1]
    listed = len(stored["conflicts"])
    assert 1 <= listed < MAX_LISTED_CONFLICTS
    # The shorter copy still counts every conflict left out, including those the reply itself left out.
    assert stored["conflicts"][-1]["message"].endswith(f"(and {20_000 - listed} more conflicts not listed)")
