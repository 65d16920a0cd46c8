"""The change-set record's encoding: read back exactly, bounded when hostile, without walking it in Python."""

from __future__ import annotations

from typing import Any
from unittest import mock

import cbor2
import pytest

from rebaser_client._record import RecordView
from rebaser_core.api import (
    Conflict,
    ConflictsStatus,
    EnqueueUpdatesResponse,
    ErrorDetails,
    ErrorStatus,
    ResponseStatus,
    SuccessStatus,
    cbor_scan,
)
from rebaser_core.errors import DecodeError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_server.record import model as record_form
from rebaser_server.record.model import ChangeSetRecord


def _full_record() -> ChangeSetRecord:
    ws, cs = WorkspacePk.new(), ChangeSetId.new()
    record = ChangeSetRecord(epoch=3, owner="o", state={"n": [1, {"x": "y"}]}, applied_seq=9, suspect=(7, 1))
    for i in range(64):
        rid = RequestId.new()
        status = (
            SuccessStatus(updates_performed=i) if i % 3 else ErrorStatus(message="e" * i, retryable=False)
        )
        response = EnqueueUpdatesResponse(id=rid, workspace_id=ws, change_set_id=cs, status=status)
        record = record.with_reply(str(rid), response, 64)
    return record


def test_a_full_record_reads_back_exactly_without_a_python_walk() -> None:
    record = _full_record()
    data = record.encode()
    with mock.patch.object(record_form, "scan_item", wraps=cbor_scan.scan_item) as scan:
        back = ChangeSetRecord.decode(data)
    assert back == record and back.encode() == data  # the reply entries are the very bytes written
    assert scan.call_count == 0


def test_entries_in_an_indefinite_array_are_read_too() -> None:
    record = _full_record()
    data = record.encode()
    head_end = len(cbor2.dumps(cbor2.loads(data)))  # the fields, then the array of replies
    entries = b"".join(record.recent.values())
    rewritten = data[:head_end] + b"\x9f" + entries + b"\xff"  # as another CBOR writer might put it
    assert ChangeSetRecord.decode(rewritten) == record


@pytest.mark.parametrize(
    "data",
    [
        b"",  # empty
        cbor2.dumps({"epoch": 1, "owner": "o", "state": {}})[:-3],  # truncated
        cbor2.dumps({"epoch": 1, "owner": "o", "state": {}}),  # no array of replies
        cbor2.dumps({"epoch": 1, "owner": "o", "state": {}})
        + b"\x81" * 100_000
        + b"\x00",  # nested past any limit
    ],
)
def test_a_malformed_record_is_a_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        ChangeSetRecord.decode(data)


_ADDRESS = "ab" * 32  # the built-in app's snapshot address: SHA-256 in lower-case hex


@pytest.mark.parametrize(
    "status",
    [
        SuccessStatus(updates_performed=0),
        SuccessStatus(updates_performed=2**40, snapshot_address=_ADDRESS),
        SuccessStatus(updates_performed=1, snapshot_address=_ADDRESS.upper()),  # not lower case: kept as text
        SuccessStatus(updates_performed=1, snapshot_address="abc"),  # odd length
        SuccessStatus(updates_performed=1, snapshot_address="b3:" + "a" * 64),
        SuccessStatus(updates_performed=1, snapshot_address=""),
        ErrorStatus(message="x" * 20_000, retryable=True),
        ConflictsStatus(conflicts=[Conflict(path="/a", expected_version="1", actual_version=None)]),
    ],
)
def test_a_recorded_reply_reads_back_as_the_status_given(status: ResponseStatus) -> None:
    """Whatever form an entry takes, the reply read back from the record is the one given (bounded, as it was)."""
    rid = RequestId.new()
    response = EnqueueUpdatesResponse(
        id=rid, workspace_id=WorkspacePk.new(), change_set_id=ChangeSetId.new(), status=status
    )
    record = ChangeSetRecord(epoch=1, owner="o", state={}).with_reply(str(rid), response, 64)
    back = ChangeSetRecord.decode(record.encode())
    bounded = record_form.bounded_status(
        status, max(record_form.REPLY_MIN_BYTES, record_form.RECENT_REPLIES_MAX_BYTES // 64)
    )
    assert back.recorded_status(str(rid)) == bounded
    view = RecordView.decode(record.encode())  # the admin commands read the same entries
    assert [(r.request_id, r.kind) for r in view.recent] == [(str(rid), status.kind)]
    # A success is written without pydantic, from these fields: a new field must be added to the compact form.
    assert set(SuccessStatus.model_fields) == {"kind", "updates_performed", "snapshot_address"}


def test_an_error_s_details_are_not_kept_in_the_record() -> None:
    """A daemon of an earlier release reads the record during an upgrade, and its error status has no details: the
    record keeps the reply as versions 1 and 2 have it (the message still says where the app raised it)."""
    ws, cs, rid = WorkspacePk.new(), ChangeSetId.new(), RequestId.new()
    status = ErrorStatus(
        message="KeyError: 'x' (at app.py:3 in apply)",
        details=ErrorDetails(error_class="KeyError", raised_at="app.py:3 in apply"),
    )
    response = EnqueueUpdatesResponse(id=rid, workspace_id=ws, change_set_id=cs, status=status)
    record = ChangeSetRecord(epoch=1, owner="o", state={}).with_reply(str(rid), response, 64)
    entry = cbor2.loads(record.recent[str(rid)])
    assert entry[1] == {"kind": "error", "message": status.message, "retryable": False}
    assert ChangeSetRecord.decode(record.encode()).recorded_status(str(rid)) == status.model_copy(
        update={"details": None}
    )


def test_a_success_entry_is_compact() -> None:
    """The whole record is written at every commit, with its last 64 replies: those are most of its bytes."""
    ws, cs = WorkspacePk.new(), ChangeSetId.new()
    for address, limit in ((None, 2_300), (_ADDRESS, 6_500)):  # 5,300 and 9,500 as full statuses
        record = ChangeSetRecord(epoch=1, owner="host:1234:" + str(RequestId.new()), state={"n": 1})
        for i in range(64):
            rid = RequestId.new()
            status = SuccessStatus(updates_performed=i, snapshot_address=address)
            response = EnqueueUpdatesResponse(id=rid, workspace_id=ws, change_set_id=cs, status=status)
            record = record.with_reply(str(rid), response, 64)
        assert len(record.encode()) < limit, (address, len(record.encode()))


def test_a_record_written_before_the_compact_form_still_reads() -> None:
    """Records of format 3 and earlier (no compact form) hold every reply as ``[request id, status]``, a success too."""
    rids = [str(RequestId.new()) for _ in range(3)]
    statuses: list[dict[str, Any]] = [
        {"kind": "success", "updates_performed": 2, "snapshot_address": _ADDRESS},
        {"kind": "error", "message": "no", "retryable": False},
        {"kind": "success", "updates_performed": 0, "snapshot_address": None},
    ]
    head = {"v": 3, "epoch": 4, "owner": "o", "state": {}, "applied_seq": 7, "task": [1, 1], "shard": 0}
    data = cbor2.dumps(head) + cbor2.dumps([[rid, s] for rid, s in zip(rids, statuses, strict=True)])
    record = ChangeSetRecord.decode(data)
    assert [record.recorded_status(rid) for rid in rids] == [
        SuccessStatus(updates_performed=2, snapshot_address=_ADDRESS),
        ErrorStatus(message="no", retryable=False),
        SuccessStatus(updates_performed=0),
    ]
    assert [(r.request_id, r.kind, r.detail) for r in RecordView.decode(data).recent] == [
        (rids[0], "success", "2 updates"),
        (rids[1], "error", "no"),
        (rids[2], "success", "0 updates"),
    ]
    # Kept as they are when the record is written again (a new reply is added in the compact form).
    assert ChangeSetRecord.decode(record.encode()).recent == record.recent


@pytest.mark.parametrize("entry", [["id"], ["id", {}, None, 1], [1, {}], {"id": {}}, "id"])
def test_a_malformed_reply_entry_is_a_decode_error(entry: Any) -> None:
    data = cbor2.dumps({"epoch": 1, "owner": "o", "state": {}}) + cbor2.dumps([entry])
    with pytest.raises(DecodeError):
        ChangeSetRecord.decode(data)
    with pytest.raises(DecodeError):
        RecordView.decode(data)
