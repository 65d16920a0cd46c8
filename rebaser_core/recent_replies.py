"""The recent replies a change-set record keeps, one CBOR item each: how they are written and read back.

The daemon writes them (``rebaser_server.record.model``) and the admin commands read them (``rebaser_client``), so the
format is defined once, here. A record keeps the last ``idempotency_window`` replies and the whole record is
written at every commit, so an entry's size is paid at every commit of its change set while it is kept:

- a success, the commonest reply, is ``[request id, updates performed, snapshot address or null]``;
- any other status is ``[request id, status]``, the status as ``model_dump(mode="json")`` gives it.

Records written before this format kept every entry as ``[request id, status]`` (a success too); those are still
read. With the default window of 64, the replies of a full record take 2.0 KiB instead of 5.0 when the app gives no
snapshot address, 6.0 instead of 9.1 with the built-in app's (``tests/unit/record/test_record_format.py``).
"""

from __future__ import annotations

from typing import Any

import cbor2

__all__ = ["entry_request_id", "entry_status", "status_entry", "success_entry"]


def success_entry(request_id: str, updates_performed: int, snapshot_address: str | None) -> bytes:
    """The entry of a success reply. (Not the address's raw bytes: a record stays text and numbers only, so that
    ``rebaser_core.api.cbor_scan`` clears it without a Python walk; random bytes would look like tags.)"""
    return bytes(cbor2.dumps([request_id, updates_performed, snapshot_address]))


def status_entry(request_id: str, status: dict[str, Any]) -> bytes:
    """The entry of any reply, ``status`` as ``model_dump(mode="json")`` gives it."""
    return bytes(cbor2.dumps([request_id, status]))


def entry_request_id(item: Any) -> str:
    """The request id of a decoded entry; ``ValueError`` if ``item`` is not an entry."""
    if not isinstance(item, list) or len(item) not in (2, 3) or not isinstance(item[0], str):
        raise ValueError("a recent reply is not [request id, status] or [request id, updates, address]")
    return item[0]


def entry_status(item: Any) -> Any:
    """The status of a decoded entry, as JSON data (for the status model to validate); ``ValueError`` if ``item``
    is not an entry."""
    entry_request_id(item)
    if len(item) == 2:
        return item[1]
    return {"kind": "success", "updates_performed": item[1], "snapshot_address": item[2]}
