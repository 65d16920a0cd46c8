"""The change-set record's encoding: read back exactly, bounded when hostile, without walking it in Python."""

from __future__ import annotations

from unittest import mock

import cbor2
import pytest

from rebaser_core.api import EnqueueUpdatesResponse, ErrorStatus, SuccessStatus, cbor_scan
from rebaser_core.errors import DecodeError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_server import state
from rebaser_server.state import ChangeSetRecord


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
    with mock.patch.object(state, "scan_item", wraps=cbor_scan.scan_item) as scan:
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


@pytest.mark.parametrize(
    "status",
    [
        SuccessStatus(updates_performed=0),
        SuccessStatus(updates_performed=2**40, snapshot_address="b3:" + "a" * 64),
        ErrorStatus(message="x" * 20_000, retryable=True),
    ],
)
def test_a_reply_entry_is_the_status_as_pydantic_dumps_it(status: SuccessStatus | ErrorStatus) -> None:
    """A success is encoded without pydantic; the entry must still be exactly what the generic path writes."""
    rid = str(RequestId.new())
    bounded = state.bounded_status(status, max(state.REPLY_MIN_BYTES, state.RECENT_REPLIES_MAX_BYTES // 64))
    assert state.reply_entry(rid, status, 64) == cbor2.dumps([rid, bounded.model_dump(mode="json")])
    assert set(SuccessStatus.model_fields) == {"kind", "updates_performed", "snapshot_address"}
