"""A change set's record as it is stored: its fields, and the recent replies that make redelivery idempotent.

The record is one value of the ``REBASER_CHANGE_SETS`` KV bucket (``rebaser_server.record.store`` reads it,
``rebaser_server.record.handle`` commits it); this module is only its form: what it holds, how it is encoded and
decoded (read back as untrusted bytes, bounded before decoding), and how a reply is remembered in it. No NATS here.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, dataclass_transform

import cbor2
from pydantic import TypeAdapter

from rebaser_core.api import (
    EVENTS_HEADER,
    SHORT_NAMES,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    ErrorStatus,
    ResponseStatus,
    SuccessStatus,
    split_window,
    window_header,
)
from rebaser_core.api.cbor_scan import DECODER_BOUNDS_DEPTH, CborLimits, scan_item, untagged
from rebaser_core.api.enqueue_updates_response import bounded_status
from rebaser_core.errors import DecodeError
from rebaser_core.recent_replies import entry_request_id, entry_status, status_entry, success_entry
from rebaser_server.app import AppState

__all__ = ["LAST_ERROR_MAX", "RECENT_REPLIES_MAX_BYTES", "REPLY_MIN_BYTES", "ChangeSetRecord", "reply_entry"]

_STATUS: TypeAdapter[ResponseStatus] = TypeAdapter(ResponseStatus)

# Records are written by daemons, but they are read back as untrusted bytes all the same: a record holding CBOR
# shared references (28/29) would expand exponentially in the decoder. Their size is bounded by the bucket.
_RECORD_LIMITS = CborLimits(max_depth=128)

# The recent replies of a record share this budget (the record must fit in one NATS message, 1 MiB by default), so
# each is stored within RECENT_REPLIES_MAX_BYTES / idempotency_window, but at least REPLY_MIN_BYTES (the default
# window of 64 gets 8 KiB each). A reply answered again from the record may so list fewer conflicts than the first.
RECENT_REPLIES_MAX_BYTES = 512 * 1024
LAST_ERROR_MAX = 300  # characters of a retryable failure kept in the record (ChangeSetRecord.last_error)
REPLY_MIN_BYTES = 1024


_T = TypeVar("_T")


@dataclass_transform(frozen_default=True)
def _immutable(cls: type[_T]) -> type[_T]:
    """A frozen dataclass for the type checker (mypy strict refuses any assignment to a field), a plain one with slots
    at run time. A frozen dataclass sets each field through ``object.__setattr__``, which made every copy of the
    record (several per request: each reply remembered, each commit's events) cost 29,000 instructions for its 18
    fields, against 6,000 for a plain one."""
    return dataclass(slots=True)(cls)


@_immutable
class ChangeSetRecord:
    epoch: int
    owner: str
    state: AppState
    dvu_pending: bool = False
    # request id -> the CBOR item [request id, reply status], encoded once: the record is written on every commit
    # and these entries are spliced into it as they are. Oldest first; bounded by Settings.idempotency_window.
    recent: Mapping[str, bytes] = field(default_factory=dict)
    # request id -> retryable failures so far
    attempts: Mapping[str, int] = field(default_factory=dict)
    # Stream sequence of the last request processed (applied, answered from the record, or dead-lettered). A
    # request at or below it is never applied again, whether or not its id is still in ``recent`` and whether or
    # not purging it from the stream succeeded: exactly-once does not depend on the purge.
    applied_seq: int = 0
    # The task delivery that owns the change set: the task message's stream sequence and its delivery count. A
    # delivery that is not newer than this one is stale (it sat in a paused daemon's buffer) and must not take over.
    task_seq: int = 0
    task_delivery: int = 0
    # Set when an owner handed the task back on purpose (nack: shutdown, retry, wedged step). A takeover of the same
    # task message without it means the owner died or froze holding it.
    handed_back: bool = False
    # Set by a peer that hands the task back for an owner gone silent (lease_mode daemon): the next owner takes over
    # from a daemon that died or froze holding it, though from a new task message.
    reaped: bool = False
    # (stream sequence, deaths with it in hand) of the first queued request after an unclean takeover: each later
    # owner writes it right before applying the request, so a request that kills or freezes every daemon that
    # applies it is dead-lettered after ``max_attempts`` such deaths (rebaser_server.changeset.handling._suspect).
    suspect: tuple[int, int] | None = None
    # The shard whose streams ``applied_seq``, ``task_seq`` and ``suspect`` count in (sequences are per stream).
    # Taken from another shard after a layout change, they start over (see ChangeSetStore.acquire).
    shard: int = 0
    # The change set's event feed (rebaser_core.api.events): durable events committed so far (the last one's seq),
    # and those not yet known to be stored in the events stream (each as its JSON-model form). The next owner publishes
    # ``outbox`` again (the stream drops repeats by Nats-Msg-Id), so a crash between a commit and its events'
    # publication loses none of them.
    events: int = 0
    outbox: tuple[Mapping[str, Any], ...] = ()
    # The stream sequence of the change set's last event known stored when this record was staged: the next owner
    # looks from there for what of ``outbox`` is stored (rebaser_server.changeset.event_pump). 0: not known.
    events_at: int = 0
    # The last retryable failure of a request that stays first in line (its class and message, bounded), while
    # ``attempts`` counts any: what an operator reads next to "retrying" (rebaser change-set show, the console).
    last_error: str = ""
    # The change set's last durable events (at most ``events_window``), oldest first, each as
    # rebaser_core.api.event_text made it. Not in the value: every write carries them in its ``Rebaser-Events``
    # header (rebaser_core.api.event_window), where a follower reads them without the record.
    feed: tuple[str, ...] = ()

    def with_feed(self, events: int, feed: tuple[str, ...]) -> ChangeSetRecord:
        """``replace(self, events=events, feed=feed)`` at a fifth of its cost (it runs once per commit): every field
        named in order (a test holds it to ``replace`` with every field set)."""
        return ChangeSetRecord(
            self.epoch,
            self.owner,
            self.state,
            self.dvu_pending,
            self.recent,
            self.attempts,
            self.applied_seq,
            self.task_seq,
            self.task_delivery,
            self.handed_back,
            self.reaped,
            self.suspect,
            self.shard,
            events,
            self.outbox,
            self.events_at,
            self.last_error,
            feed,
        )

    def feed_header(self, new: int) -> dict[str, str] | None:
        """The headers of a write of this record whose last ``new`` events it decides (None: no events yet)."""
        if not self.feed:
            return None
        return {EVENTS_HEADER: window_header(self.feed, min(new, len(self.feed)))}

    def encode(self) -> bytes:
        """Two CBOR items back to back: the record's fields, then the array of recent replies (pre-encoded)."""
        head = {
            "v": 4,  # 4: success replies in the compact form (rebaser_core.recent_replies)
            "epoch": self.epoch,
            "owner": self.owner,
            "state": self.state,
            "dvu_pending": self.dvu_pending,
            "attempts": dict(self.attempts),
            "applied_seq": self.applied_seq,
            "task": [self.task_seq, self.task_delivery],
            "handed_back": self.handed_back,
            "suspect": list(self.suspect) if self.suspect else None,
            "shard": self.shard,
            "events": self.events,
        }
        if self.outbox:
            head["outbox"] = [dict(event) for event in self.outbox]
        if self.reaped:
            head["reaped"] = True
        if self.events_at:
            head["events_at"] = self.events_at
        if self.last_error:
            head["last_error"] = self.last_error
        return (
            bytes(cbor2.dumps(head)) + _cbor_array_header(len(self.recent)) + b"".join(self.recent.values())
        )

    @classmethod
    def decode(cls, data: bytes, headers: Mapping[str, str] | None = None) -> ChangeSetRecord:
        """The record stored as ``data``, with the event window of the write's ``headers`` (if given)."""
        try:
            # Read at every activation, and a record holds its recent replies: a Python walk of 5 KB takes 0.3 ms.
            # Without a byte that could start a tag nothing can expand, and the decoder bounds the depth itself.
            if not (DECODER_BOUNDS_DEPTH and untagged(data)):
                scan_item(data, scan_item(data, 0, _RECORD_LIMITS), _RECORD_LIMITS)
        except ValueError as err:
            raise DecodeError(f"change-set record is not valid: {err}") from None
        try:
            raw, recent = _decode_parts(data)
        except (cbor2.CBORDecodeError, ValueError, EOFError, TypeError) as err:
            raise DecodeError(f"change-set record is not valid: {err}") from None
        return cls(
            epoch=int(raw["epoch"]),
            owner=str(raw["owner"]),
            state=raw["state"],
            dvu_pending=bool(raw.get("dvu_pending", False)),
            recent=recent,
            attempts={str(k): int(v) for k, v in raw.get("attempts", {}).items()},
            applied_seq=int(raw.get("applied_seq", 0)),
            task_seq=int(raw.get("task", (0, 0))[0]),
            task_delivery=int(raw.get("task", (0, 0))[1]),
            handed_back=bool(raw.get("handed_back", False)),
            reaped=bool(raw.get("reaped", False)),
            suspect=(int(suspect[0]), int(suspect[1])) if (suspect := raw.get("suspect")) else None,
            shard=int(raw.get("shard", 0)),
            events=int(raw.get("events", 0)),
            events_at=int(raw.get("events_at", 0)),
            outbox=tuple(item for item in raw.get("outbox", ()) if isinstance(item, dict)),
            last_error=str(raw.get("last_error", ""))[:LAST_ERROR_MAX],
            feed=_feed_of(headers, int(raw.get("events", 0))),
        )

    def reply_for(self, request: EnqueueUpdatesRequest) -> EnqueueUpdatesResponse | None:
        """The reply already given to ``request`` if it was processed (then it must not be applied again)."""
        status = self.recorded_status(str(request.id))
        if status is None:
            return None
        return EnqueueUpdatesResponse(
            id=request.id,
            workspace_id=request.workspace_id,
            change_set_id=request.change_set_id,
            status=status,
        )

    def recorded_status(self, request_id: str) -> ResponseStatus | None:
        """The status of the reply recorded for ``request_id``, if the record still holds it."""
        raw = self.recent.get(request_id)
        if raw is None:
            return None
        return _STATUS.validate_python(entry_status(cbor2.loads(raw)))

    def with_reply(
        self, request_id: str, response: EnqueueUpdatesResponse, window: int, **changes: Any
    ) -> ChangeSetRecord:
        """This record with ``response`` remembered for ``request_id`` (and ``changes`` to other fields)."""
        recent = dict(self.recent)
        recent.pop(request_id, None)
        recent[request_id] = reply_entry(request_id, response.status, window)
        while len(recent) > window:
            del recent[next(iter(recent))]
        attempts = (
            {k: v for k, v in self.attempts.items() if k != request_id} if self.attempts else self.attempts
        )
        last_error = self.last_error if attempts else ""
        return replace(self, recent=recent, attempts=attempts, last_error=last_error, **changes)


def _feed_of(headers: Mapping[str, str] | None, events: int) -> tuple[str, ...]:
    """The window a write carried, if its last event is the record's last (else it is not this record's: none)."""
    value = headers.get(EVENTS_HEADER) if headers else None
    if not value:
        return ()
    feed = split_window(value)
    if not feed or _seq_of(feed[-1]) != events:
        return ()
    return feed


def _seq_of(text: str) -> int | None:
    try:
        seq = json.loads(text).get(SHORT_NAMES["seq"])
    except (ValueError, AttributeError):
        return None
    return seq if isinstance(seq, int) else None


def reply_entry(request_id: str, status: ResponseStatus, window: int) -> bytes:
    """A recent reply as the record stores it (``rebaser_core.recent_replies``), the status bounded so that
    ``window`` of them fit in the record."""
    if type(status) is SuccessStatus:
        # The commonest reply, and never cut: written without pydantic, in the compact form.
        return success_entry(request_id, status.updates_performed, status.snapshot_address)
    if type(status) is ErrorStatus and status.details is not None:
        # Kept as versions 1 and 2 have it: a daemon of an earlier release reads this record too (during an
        # upgrade), and the message still says where the app raised it. A reply replayed from here has no details.
        status = status.model_copy(update={"details": None})
    bounded = bounded_status(status, max(REPLY_MIN_BYTES, RECENT_REPLIES_MAX_BYTES // window))
    return status_entry(request_id, bounded.model_dump(mode="json"))


def _decode_parts(data: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The record's fields, and its recent replies as their own encoded bytes (spliced back as they are by
    ``encode``): each entry is sliced out of ``data`` by the decoder's position, not encoded again."""
    stream = io.BytesIO(data)
    decoder = cbor2.CBORDecoder(stream)
    raw = decoder.decode()
    head = _array_head(data, stream.tell())
    if head is None:  # not the array encode() writes (an indefinite one, say): decode and encode each entry
        return raw, {entry_request_id(item): bytes(cbor2.dumps(item)) for item in decoder.decode()}
    count, start = head
    stream.seek(start)
    recent: dict[str, bytes] = {}
    for _ in range(count):
        rid = entry_request_id(decoder.decode())
        end = stream.tell()
        recent[rid] = data[start:end]
        start = end
    return raw, recent


def _array_head(data: bytes, pos: int) -> tuple[int, int] | None:
    """(items, offset of the first) of the definite-length CBOR array at ``pos``; None if it is not one."""
    if pos >= len(data):
        return None
    initial = data[pos]
    if 0x80 <= initial <= 0x97:
        return initial & 0x1F, pos + 1
    size = {0x98: 1, 0x99: 2, 0x9A: 4}.get(initial)
    if size is None or pos + 1 + size > len(data):
        return None
    return int.from_bytes(data[pos + 1 : pos + 1 + size], "big"), pos + 1 + size


def _cbor_array_header(length: int) -> bytes:
    """The head of a CBOR array (major type 4) of ``length`` items."""
    if length < 24:
        return bytes([0x80 | length])
    if length < 0x100:
        return bytes([0x98, length])
    if length < 0x10000:
        return bytes([0x99]) + length.to_bytes(2, "big")
    return bytes([0x9A]) + length.to_bytes(4, "big")
