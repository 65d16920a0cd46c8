"""The change-set record, as far as the client reads it: for skipping a request (where the change set's queue
starts), for the paused and resumed notices (the last event's seq) and for the operators' reports.

The record is the daemons' own (``rebaser_server/record/model.py``); the client never imports the server, so
:class:`RecordView` decodes the few fields it needs, tolerantly (a field it does not know is ignored, a missing one
has its default). ``tests/unit/client/test_admin_format.py`` checks it reads what ``ChangeSetRecord`` writes.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import cbor2
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError

from rebaser_core.errors import DecodeError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.recent_replies import entry_request_id, entry_status
from rebaser_core.subjects import Subjects

__all__ = ["RecentReply", "RecordView", "read_record"]

_RECORD_MAX_DEPTH = 128


@dataclass(frozen=True)
class RecentReply:
    request_id: str
    kind: str  # success | conflicts | error | refused
    detail: str  # updates performed, conflicts listed, or the error message

    @property
    def at(self) -> datetime | None:
        """When the request was made: a request id is a ULID, whose first 48 bits are its creation time."""
        try:
            return RequestId(self.request_id).ulid.datetime
        except ValueError:
            return None


@dataclass(frozen=True)
class RecordView:
    epoch: int
    owner: str
    dvu_pending: bool
    applied_seq: int
    attempts: Mapping[str, int]
    suspect: tuple[int, int] | None
    handed_back: bool
    recent: tuple[RecentReply, ...]  # oldest first
    shard: int = 0  # the shard whose requests stream ``applied_seq`` counts in
    events: int = 0  # durable events of the change set's feed so far (the last one's seq)
    last_error: str = ""  # the last retryable failure (class: message) while ``attempts`` counts any

    @classmethod
    def decode(cls, data: bytes) -> RecordView:
        # Imported here: rebaser_core.api's package brings the wire models (pydantic), which `rebaser status` needs
        # only once there is a record to read.
        from rebaser_core.api.cbor_scan import CborLimits, scan_item

        limits = CborLimits(max_depth=_RECORD_MAX_DEPTH)
        try:
            scan_item(data, scan_item(data, 0, limits), limits)
            decoder = cbor2.CBORDecoder(io.BytesIO(data))
            raw, entries = decoder.decode(), decoder.decode()
            suspect = raw.get("suspect")
            return cls(
                epoch=int(raw.get("epoch", 0)),
                owner=str(raw.get("owner", "")),
                dvu_pending=bool(raw.get("dvu_pending", False)),
                applied_seq=int(raw.get("applied_seq", 0)),
                attempts={str(k): int(v) for k, v in raw.get("attempts", {}).items()},
                suspect=(int(suspect[0]), int(suspect[1])) if suspect else None,
                handed_back=bool(raw.get("handed_back", False)),
                recent=tuple(_recent(entry_request_id(item), entry_status(item)) for item in entries),
                shard=int(raw.get("shard", 0)),
                events=int(raw.get("events", 0)),
                last_error=str(raw.get("last_error", ""))[:300],
            )
        except (ValueError, TypeError, AttributeError, IndexError, KeyError, cbor2.CBORDecodeError) as err:
            raise DecodeError(f"change-set record is not valid: {err}") from None


async def read_record(
    js: JetStreamContext,
    subjects: Subjects,
    workspace_id: WorkspacePk | str,
    change_set_id: ChangeSetId | str,
) -> RecordView | None:
    """The change set's record; None if it has none (or the deployment has no records bucket yet). NATS errors are
    left to the caller, which turns them into its one line."""
    try:
        kv = await js.key_value(subjects.change_sets_bucket)
        entry = await kv.get(
            f"{workspace_id}.{change_set_id}"
        )  # Subjects.change_set_key, for ids or their text
    except (BucketNotFoundError, KeyNotFoundError):
        return None
    return None if not entry.value else RecordView.decode(entry.value)


def _recent(request_id: str, status: Any) -> RecentReply:
    kind = str(status.get("kind", "?")) if isinstance(status, dict) else "?"
    if kind == "success":
        detail = f"{status.get('updates_performed', 0)} updates"
    elif kind == "conflicts":
        detail = f"{len(status.get('conflicts') or [])} conflicts"
    elif kind in ("error", "refused"):
        detail = str(status.get("message", ""))
    else:
        detail = ""
    return RecentReply(request_id, kind, detail)
