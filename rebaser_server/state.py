"""Each change set's record: app state, ownership epoch, recent replies; committed only by compare-and-set.

The record lives in the ``REBASER_CHANGE_SETS`` KV bucket under ``<workspace>.<change_set>``. Two rules make the
at-least-once delivery of requests safe:

- **Fence.** Taking a change set over bumps ``epoch`` with a compare-and-set, and every later commit is a
  compare-and-set on the revision this owner last wrote. A stale owner (paused past ack_wait while another daemon
  took over) finds the revision moved and gets :class:`~rebaser_core.errors.FencedError`: its work is discarded,
  never written over newer work.
- **Idempotency.** A commit also records the request id and its reply (the last ``idempotency_window`` of them).
  A request delivered again (its delete failed, or the owner crashed between commit and delete) is answered from
  the record instead of being applied twice.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import cbor2
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from rebaser_core.api import EnqueueUpdatesRequest, EnqueueUpdatesResponse
from rebaser_core.api.enqueue_updates_response import bounded_status
from rebaser_core.errors import FencedError
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.app import AppState, ChangeSet

__all__ = ["ChangeSetHandle", "ChangeSetRecord", "ChangeSetStore"]

# A competing takeover can make acquire's compare-and-set fail; it re-reads and tries again this many times.
_ACQUIRE_ATTEMPTS = 5

# The recent replies of a record share this budget (the record must fit in one NATS message, 1 MiB by default), so
# each is stored within RECENT_REPLIES_MAX_BYTES / idempotency_window, but at least REPLY_MIN_BYTES (the default
# window of 64 gets 8 KiB each). A reply answered again from the record may so list fewer conflicts than the first.
RECENT_REPLIES_MAX_BYTES = 512 * 1024
REPLY_MIN_BYTES = 1024


@dataclass(frozen=True, slots=True)
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

    def encode(self) -> bytes:
        """Two CBOR items back to back: the record's fields, then the array of recent replies (pre-encoded)."""
        head = {
            "v": 2,
            "epoch": self.epoch,
            "owner": self.owner,
            "state": self.state,
            "dvu_pending": self.dvu_pending,
            "attempts": dict(self.attempts),
        }
        return (
            bytes(cbor2.dumps(head)) + _cbor_array_header(len(self.recent)) + b"".join(self.recent.values())
        )

    @classmethod
    def decode(cls, data: bytes) -> ChangeSetRecord:
        decoder = cbor2.CBORDecoder(io.BytesIO(data))
        raw = decoder.decode()
        entries = decoder.decode()
        return cls(
            epoch=int(raw["epoch"]),
            owner=str(raw["owner"]),
            state=raw["state"],
            dvu_pending=bool(raw.get("dvu_pending", False)),
            recent={str(rid): bytes(cbor2.dumps([rid, status])) for rid, status in entries},
            attempts={str(k): int(v) for k, v in raw.get("attempts", {}).items()},
        )

    def reply_for(self, request: EnqueueUpdatesRequest) -> EnqueueUpdatesResponse | None:
        """The reply already given to ``request`` if it was processed (then it must not be applied again)."""
        raw = self.recent.get(str(request.id))
        if raw is None:
            return None
        return EnqueueUpdatesResponse.model_validate(
            {
                "id": request.id,
                "workspace_id": request.workspace_id,
                "change_set_id": request.change_set_id,
                "status": cbor2.loads(raw)[1],
            }
        )

    def with_reply(self, request_id: str, response: EnqueueUpdatesResponse, window: int) -> ChangeSetRecord:
        recent = dict(self.recent)
        recent.pop(request_id, None)
        status = bounded_status(response.status, max(REPLY_MIN_BYTES, RECENT_REPLIES_MAX_BYTES // window))
        recent[request_id] = bytes(cbor2.dumps([request_id, status.model_dump(mode="json")]))
        while len(recent) > window:
            del recent[next(iter(recent))]
        attempts = {k: v for k, v in self.attempts.items() if k != request_id}
        return replace(self, recent=recent, attempts=attempts)


def _cbor_array_header(length: int) -> bytes:
    """The head of a CBOR array (major type 4) of ``length`` items."""
    if length < 24:
        return bytes([0x80 | length])
    if length < 0x100:
        return bytes([0x98, length])
    if length < 0x10000:
        return bytes([0x99]) + length.to_bytes(2, "big")
    return bytes([0x9A]) + length.to_bytes(4, "big")


class ChangeSetHandle:
    """An owner's view of one change set's record. Commits are serialized by ``lock``."""

    def __init__(self, kv: KeyValue, key: str, record: ChangeSetRecord, revision: int) -> None:
        self._kv = kv
        self.key = key
        self.record = record
        self.revision = revision
        # Request applies and DVU runs both read-modify-write the record; the lock orders them inside one owner,
        # so a failed compare-and-set can only mean another owner wrote: the fence.
        self.lock = asyncio.Lock()

    async def commit(self, record: ChangeSetRecord) -> None:
        """Write ``record`` if nobody else wrote since our last write; else raise FencedError."""
        try:
            self.revision = await self._kv.update(self.key, record.encode(), last=self.revision)
        except KeyWrongLastSequenceError:
            raise FencedError(
                f"change set {self.key} was taken over (epoch {record.epoch} is stale)"
            ) from None
        self.record = record

    async def still_owner(self) -> bool:
        """True if the stored record is still the one this owner last wrote."""
        try:
            entry = await self._kv.get(self.key)
        except KeyNotFoundError:
            return False
        return entry.revision == self.revision


class ChangeSetStore:
    """The KV bucket of change-set records."""

    def __init__(self, js: JetStreamContext, settings: Settings) -> None:
        self._js = js
        self._settings = settings
        self._kv: KeyValue | None = None

    async def open(self) -> None:
        name = self._settings.subjects.change_sets_bucket
        try:
            self._kv = await self._js.key_value(name)
        except BucketNotFoundError:
            from nats.js.api import KeyValueConfig, StorageType

            storage = StorageType.FILE if self._settings.storage == "file" else StorageType.MEMORY
            self._kv = await self._js.create_key_value(
                KeyValueConfig(bucket=name, history=1, storage=storage, replicas=self._settings.replicas)
            )

    @property
    def kv(self) -> KeyValue:
        if self._kv is None:
            raise RuntimeError("ChangeSetStore.open() was not called")
        return self._kv

    async def read(self, change_set: ChangeSet) -> ChangeSetRecord | None:
        try:
            entry = await self.kv.get(self._key(change_set))
        except KeyNotFoundError:
            return None
        return None if entry.value is None else ChangeSetRecord.decode(entry.value)

    async def create(self, change_set: ChangeSet, owner: str, state: AppState) -> bool:
        """Create the record of a change set that has none (a fork); False if it already exists."""
        try:
            await self.kv.create(
                self._key(change_set), ChangeSetRecord(epoch=0, owner=owner, state=state).encode()
            )
        except KeyWrongLastSequenceError:
            return False
        return True

    async def acquire(self, change_set: ChangeSet, owner: str, initial_state: AppState) -> ChangeSetHandle:
        """Become the owner: bump the epoch with compare-and-set, fencing every previous owner."""
        key = self._key(change_set)
        for _ in range(_ACQUIRE_ATTEMPTS):
            try:
                entry = await self.kv.get(key)
            except KeyNotFoundError:
                record = ChangeSetRecord(epoch=1, owner=owner, state=initial_state)
                try:
                    revision = await self.kv.create(key, record.encode())
                except KeyWrongLastSequenceError:
                    continue
                return ChangeSetHandle(self.kv, key, record, revision)
            assert entry.value is not None and entry.revision is not None
            current = ChangeSetRecord.decode(entry.value)
            record = replace(current, epoch=current.epoch + 1, owner=owner)
            try:
                revision = await self.kv.update(key, record.encode(), last=entry.revision)
            except KeyWrongLastSequenceError:
                continue
            return ChangeSetHandle(self.kv, key, record, revision)
        raise FencedError(f"could not take change set {key} over: it kept changing")

    @staticmethod
    def _key(change_set: ChangeSet) -> str:
        return Subjects.change_set_key(change_set.workspace_id, change_set.change_set_id)
