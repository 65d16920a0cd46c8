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

The record's form (its fields, encoding and decoding) is ``rebaser_server.record.model``; this module reads
and commits it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from rebaser_core.errors import FencedError
from rebaser_core.headers import get_header
from rebaser_core.nats.pub_ack import read_pub_ack
from rebaser_core.nats.requester import Requester
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.app import AppState, ChangeSet
from rebaser_server.record.direct_reads import DirectReads
from rebaser_server.record.model import ChangeSetRecord
from rebaser_server.task.delivery import Delivery

__all__ = [
    "Acquired",
    "ChangeSetHandle",
    "ChangeSetStore",
    "NothingToDo",
    "StaleDelivery",
    "StillSilent",
    "TaskDelivery",
]

log = logging.getLogger(__name__)

# The header a compare-and-set write carries, and the error JetStream answers when the key moved on.
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
_WRONG_LAST_SEQUENCE = 10071
_KV_OPERATION = "KV-Operation"

# Asked by a peer handing back a silent daemon's change sets (mark_reaped): is it silent still?
StillSilent = Callable[[], Awaitable[bool]]

# A competing takeover can make acquire's compare-and-set fail; it re-reads and tries again this many times.
_ACQUIRE_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class TaskDelivery:
    """Which delivery of which task message: the stream sequence of the task and its delivery count."""

    seq: int
    count: int

    @classmethod
    def of(cls, msg: Msg) -> TaskDelivery:
        # From the reply subject, as nats-py's ``msg.metadata`` reads it, without its dataclasses and datetime.
        delivery = Delivery.of(msg)
        return cls(delivery.stream_seq, delivery.delivered)

    def __str__(self) -> str:
        return f"({self.seq}, {self.count})"


class StaleDelivery(Exception):
    """A task delivery older than the one that owns the change set: act on it in no way (no ack, no nak)."""


class NothingToDo(Exception):
    """A task for a change set with no record and no queued request: drop it without creating a record."""


class ChangeSetHandle:
    """An owner's view of one change set's record. Commits are serialized by ``lock``."""

    def __init__(
        self,
        kv: KeyValue,
        key: str,
        record: ChangeSetRecord,
        revision: int,
        requester: Requester | None = None,
        timeout: float = 5.0,
        *,
        reads: DirectReads | None = None,
    ) -> None:
        self._kv = kv
        self._reads = reads  # the record read as its stream leader has it (None: through nats-py's KeyValue)
        self.key = key
        self.record = record
        self.revision = revision
        self.written = False  # this owner wrote the record at least once (see ChangeSetStore.acquire)
        self._unanswered: bytes | None = None  # the last write, if it failed without an answer (see commit)
        self._unanswered_record: ChangeSetRecord | None = None  # and the record it wrote
        self._requester = requester
        self._timeout = timeout
        # Request applies and DVU runs both read-modify-write the record; the lock orders them inside one owner,
        # so a failed compare-and-set can only mean another owner wrote: the fence.
        self.lock = asyncio.Lock()

    async def commit(self, record: ChangeSetRecord) -> None:
        """Write ``record`` if nobody else wrote since our last write; else raise FencedError.

        A write whose answer was lost (a timeout, a leader change) may still have been stored: the next one then
        finds the revision moved, by this owner's own hand. It is told apart by the stored bytes, which are then
        exactly the ones that write sent (another owner's record names another owner or epoch): the revision is
        taken from the store and the write made again, instead of fencing this owner out of its own change set."""
        value = record.encode()
        # Every write carries the change set's last events (rebaser_core.api.event_window); those past the record
        # this owner last wrote are the ones this write decides.
        headers = record.feed_header(record.events - self.record.events)
        for attempt in (1, 2):
            try:
                self.revision = await self._write(value, headers)
            except KeyWrongLastSequenceError:
                unanswered = self._unanswered
                if attempt == 2 or unanswered is None or not await self._own_write_landed(unanswered):
                    raise FencedError(
                        f"change set {self.key} was taken over (epoch {record.epoch} is stale)"
                    ) from None
                continue  # from the revision of this owner's own write
            except asyncio.CancelledError:
                self._unanswered, self._unanswered_record = (
                    value,
                    record,
                )  # stored or not: the next write finds out
                raise
            except Exception:
                # Stored or not: found out now if the store answers, else by the next write.
                self._unanswered, self._unanswered_record = value, record
                if not await self._landed_after_all(value):
                    raise
            break
        self._unanswered = self._unanswered_record = None
        self.record = record
        self.written = True

    async def _landed_after_all(self, value: bytes) -> bool:
        """A write got no answer: whether it was stored after all, read at once. Taken for stored, it is this
        owner's record from here on (its replies go out, its events are published). Left unknown, anything this
        owner wrote next would be built from the record before it, and would roll the stored one back (a DVU run,
        a hand-back mark, a lapse claim) or give its events' ``seq`` numbers again (the next group)."""
        try:
            return await self._own_write_landed(value)
        except Exception as err:
            log.info("%s: a write got no answer and the record could not be read (%r)", self.key, err)
            return False

    @property
    def write_unanswered(self) -> bool:
        """This owner's last write got no answer and is not known to be stored or not (see commit)."""
        return self._unanswered is not None

    async def refresh_after_lost_write(self) -> bool:
        """Before a write built from :attr:`record`: if this owner's last write got no answer and could not be read
        back then, read it now, and if it was stored, build from it (True: :attr:`record` is that write now).
        Raises if the record cannot be read (the write would fail anyway). Call with :attr:`lock` held."""
        unanswered, record = self._unanswered, self._unanswered_record
        if unanswered is None or record is None or not await self._own_write_landed(unanswered):
            return False
        self.record = record
        self._unanswered = self._unanswered_record = None
        self.written = True
        return True

    async def claim_after_lapse(self) -> bool | None:
        """``lease_mode`` daemon, this owner's heartbeat lapsed: may it nak its task itself? Marks the record reaped
        (compare-and-set on this owner's last write), as a peer reaping this daemon would. True: marked, so a peer's
        reap, racing, finds it done and leaves the task alone; False: somebody wrote first (a peer's reap, which
        deletes this task message and publishes a fresh one: a nak in between would give the change set to two
        daemons at once); None: not known (NATS trouble), ask again."""
        try:
            async with asyncio.timeout(self._timeout), self.lock:
                await self.refresh_after_lost_write()
                await self.commit(replace(self.record, reaped=True))
        except FencedError:
            return False
        except (TimeoutError, nats.errors.Error, OSError):
            return None
        return True

    async def _write(self, value: bytes, headers: dict[str, str] | None) -> int:
        if self._requester is None:
            return await _update_with_headers(self._kv, self.key, value, self.revision, headers)
        return await self._update(value, headers)

    async def _own_write_landed(self, value: bytes) -> bool:
        """Whether the record stored now is ``value``, the write of this owner that got no answer; if so, its
        revision becomes the one the next write expects."""
        entry = await _read_last(self._kv, self.key, self._reads, self._timeout)
        if entry is None or entry.value != value:
            return False
        log.info("%s: a write that got no answer was stored; going on from it", self.key)
        self.revision = entry.revision
        return True

    async def _update(self, value: bytes, headers: dict[str, str] | None) -> int:
        """``KeyValue.update`` (a publish to the key's subject expecting its last revision) over the light
        requester: this runs once per group commit."""
        assert self._requester is not None
        reply = await self._requester.request(
            _key_subject(self._kv, self.key),
            value,
            timeout=self._timeout,
            headers={**(headers or {}), _EXPECTED_LAST: str(self.revision)},
        )
        ack = read_pub_ack(reply.data)
        error = ack.get("error")
        if error is not None:
            if error.get("err_code") == _WRONG_LAST_SEQUENCE:
                raise KeyWrongLastSequenceError(description=error.get("description", ""))
            raise APIError.from_error(error)
        return int(ack["seq"])

    async def still_owner(self) -> bool:
        """True if the stored record is still the one this owner last wrote (or, if it wrote none yet, still the
        one it read: nobody else wrote either)."""
        entry = await _read_last(self._kv, self.key, self._reads, self._timeout)
        if entry is None:
            return self.revision == 0
        return (entry.value is not None or not self.written) and entry.revision == self.revision


class _Entry:
    """The last message on a record's key: its value (None: deleted or purged), its revision, and its headers (the
    write's event window)."""

    __slots__ = ("headers", "revision", "value")

    def __init__(self, value: bytes | None, revision: int, headers: dict[str, str] | None = None) -> None:
        self.value = value
        self.revision = revision
        self.headers = headers

    def record(self) -> ChangeSetRecord:
        assert self.value is not None
        return ChangeSetRecord.decode(self.value, self.headers)


def _key_subject(kv: KeyValue, key: str) -> str:
    return (getattr(kv, "_pre", None) or f"$KV.{kv._name}.") + key


async def _update_with_headers(
    kv: KeyValue, key: str, value: bytes, last: int, headers: dict[str, str] | None
) -> int:
    """``KeyValue.update`` with headers of our own (nats-py's takes none), through nats-py's JetStream context."""
    if headers is None:
        return await kv.update(key, value, last=last)
    try:
        ack = await kv._js.publish(
            _key_subject(kv, key), value, headers={**headers, _EXPECTED_LAST: str(last)}
        )
    except APIError as err:
        if err.err_code == _WRONG_LAST_SEQUENCE:
            raise KeyWrongLastSequenceError(description=err.description) from None
        raise
    return int(ack.seq)


async def _read_last(kv: KeyValue, key: str, reads: DirectReads | None, timeout: float) -> _Entry | None:
    """The record's last entry, or None if the key never existed.

    ``KeyValue.get`` goes through nats-py's JetStream manager (a random reply token, ``wait_for``, the headers parsed
    by the email parser): 14 % of a daemon taking a new change set for each request, where acquire and release both
    read the record. Here it is one read over the light requester, as the stream leader has it: a direct get where
    only the leader can answer one, else a ``STREAM.MSG.GET`` (rebaser_server.record.direct_reads).
    """
    if reads is None:
        # nats-py's KeyValue.get gives no headers: the stream's last message on the key, which has them.
        try:
            raw = await kv._js.get_last_msg(_kv_stream(kv), _key_subject(kv, key))
        except NotFoundError:
            return None
        headers = dict(raw.headers) if raw.headers else None
        gone = get_header(headers, _KV_OPERATION) in ("DEL", "PURGE")
        return _Entry(None if gone else raw.data, int(raw.seq or 0), headers)
    stored = await reads.last_message(_kv_stream(kv), _key_subject(kv, key), timeout=timeout)
    if stored is None:
        return None
    # A DEL or PURGE marker is an entry without a value, as nats-py reads it (KeyDeletedError).
    gone = get_header(stored.headers, _KV_OPERATION) in ("DEL", "PURGE")
    return _Entry(None if gone else stored.data, stored.seq, stored.headers)


def _kv_stream(kv: KeyValue) -> str:
    return getattr(kv, "_stream", None) or f"KV_{kv._name}"


@dataclass(frozen=True, slots=True)
class Acquired:
    handle: ChangeSetHandle
    unclean: bool  # taken over from an owner that died or froze holding the same task


class ChangeSetStore:
    """The KV bucket of change-set records."""

    def __init__(self, js: JetStreamContext, settings: Settings, requester: Requester | None = None) -> None:
        self._js = js
        self._settings = settings
        self._kv: KeyValue | None = None
        self._requester = requester  # commits go through it when given (the daemon's)
        # Reads of a stream's last message as its leader has it (records, and the requests streams' queued checks).
        self.reads: DirectReads | None = (
            None if requester is None else DirectReads(requester, settings.nats_timeout)
        )

    async def open(self) -> None:
        name = self._settings.subjects.change_sets_bucket
        try:
            self._kv = await self._js.key_value(name)
        except BucketNotFoundError:
            from nats.js.api import KeyValueConfig, StorageType

            storage = StorageType.FILE if self._settings.storage == "file" else StorageType.MEMORY
            self._kv = await self._js.create_key_value(
                KeyValueConfig(
                    bucket=name,
                    history=1,
                    storage=storage,
                    replicas=self._settings.replicas,
                    # Only where the leader alone holds it: nats-py's own reads (KeyValue.get) go direct too then,
                    # and with replicas a lagging one could answer them.
                    direct=self._settings.replicas == 1,
                )
            )
        if self.reads is not None:
            self.reads.forget()  # (re)opened: after a reconnect the server may be another one

    @property
    def requester(self) -> Requester | None:
        return self._requester

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

    async def mark_reaped(
        self, change_set: ChangeSet, owner: str, *, still_silent: StillSilent | None = None
    ) -> ChangeSetRecord | None:
        """lease_mode daemon, a peer handing back the task of ``owner`` gone silent: if the record names ``owner``,
        mark it (compare-and-set) so the next owner counts a takeover; the record as it was, or None if it names
        another owner, has no task, or changed meanwhile (nothing to hand back now).

        ``still_silent`` is asked after the read and before the mark: False (the owner's heartbeat is back) leaves
        the record. Asked in that order, an ownership taken under the heartbeat come back is never marked: taken
        before the read, the heartbeat was back before the question; taken after it, the mark's compare fails."""
        key = self._key(change_set)
        entry = await _read_last(self.kv, key, self.reads, self._settings.nats_timeout)
        if entry is None or entry.value is None:
            return None
        record = entry.record()
        if record.owner != owner or not record.task_seq or record.reaped:
            return None  # (reaped: by a peer, or by the owner itself before its own hand-back)
        if still_silent is not None and not await still_silent():
            return None
        try:
            marked = replace(record, reaped=True)
            await _update_with_headers(self.kv, key, marked.encode(), entry.revision, marked.feed_header(0))
        except KeyWrongLastSequenceError:
            return None
        return record

    async def create(self, change_set: ChangeSet, owner: str, state: AppState) -> bool:
        """Create the record of a change set that has none (a fork); False if it already exists."""
        try:
            await self.kv.create(
                self._key(change_set), ChangeSetRecord(epoch=0, owner=owner, state=state).encode()
            )
        except KeyWrongLastSequenceError:
            return False
        return True

    async def acquire(
        self,
        change_set: ChangeSet,
        owner: str,
        initial_state: AppState,
        delivery: TaskDelivery,
        *,
        shard: int = 0,
        has_work: Callable[[], Awaitable[bool]] | None = None,
    ) -> Acquired:
        """Become the owner for ``delivery``: bump the epoch with compare-and-set, fencing every previous owner.

        Raises :class:`StaleDelivery` if the record names a delivery of the same task message that is at least as
        new: this one was redelivered elsewhere while it waited in a paused daemon's buffer. A change set without a
        record is created only if ``has_work()`` says a request is queued; else :class:`NothingToDo`: a record
        is an ownership epoch that nothing ever removes, so a task with nothing to do (anyone able to publish tasks
        could send them) must not leave one. A real task always finds work or a record: a client publishes its
        task only after its request is stored, and the sweep and the release publish tasks only for queued ones.
        """
        key = self._key(change_set)
        for _ in range(_ACQUIRE_ATTEMPTS):
            entry = await _read_last(self.kv, key, self.reads, self._settings.nats_timeout)
            if entry is None or entry.value is None:  # never written, or deleted
                if has_work is not None and not await has_work():
                    raise NothingToDo(
                        f"change set {key}: a task with no record and no queued request"
                    ) from None
                record = ChangeSetRecord(
                    epoch=1,
                    owner=owner,
                    state=initial_state,
                    task_seq=delivery.seq,
                    task_delivery=delivery.count,
                    shard=shard,
                )
                # Created by compare-and-set on what was read: nothing (revision 0), or the deletion marker, as
                # KeyValue.create does it. Someone else writing first makes it fail.
                handle = self._handle(key, record, 0 if entry is None else entry.revision)
                if delivery.count == 1:
                    # The task's first delivery: nobody can have applied anything to this change set, so there is
                    # nobody to fence and no crash to count. The record is written by the first commit (the same
                    # compare-and-set on what was read), one round trip fewer before a new change set's first reply.
                    # Not with lease_mode daemon: a peer hands back only the tasks whose record names their owner,
                    # so the record exists from here on (else an owner dead before its first commit would leave the
                    # change set waiting task_ack_wait).
                    if self._settings.lease_mode == "daemon":
                        try:
                            await handle.commit(record)
                        except FencedError:
                            continue
                    return Acquired(handle, unclean=False)
                # A redelivery with no record: the owner of an earlier delivery may have died in the middle of the
                # first request (it had written nothing yet), so this counts as an unclean takeover, and the record
                # is written now, before anything is applied, as the suspect count needs.
                try:
                    await handle.commit(record)
                except FencedError:
                    continue
                return Acquired(handle, unclean=True)
            current = entry.record()
            if current.shard != shard:
                # The change set moved shard (a layout change): the sequences it kept count in the old shard's
                # streams. Safe to start over: its new shard is only served once its old one has drained
                # (rebaser_server.changeset.migration), and replies are still remembered by request id (``recent``).
                current = replace(
                    current, applied_seq=0, task_seq=0, task_delivery=0, suspect=None, shard=shard
                )
            same_task = current.task_seq == delivery.seq
            # (Only the same task message is compared: sequences restart if a memory-storage stream is lost. A
            # delivery wrongly judged stale heals itself: untouched, it is redelivered with a higher count.)
            if same_task and current.task_delivery >= delivery.count:
                raise StaleDelivery(
                    f"change set {key}: task delivery {delivery} is not newer than the owner's "
                    f"({current.task_seq}, {current.task_delivery})"
                )
            record = replace(
                current,
                epoch=current.epoch + 1,
                owner=owner,
                task_seq=delivery.seq,
                task_delivery=delivery.count,
                handed_back=False,
                reaped=False,
            )
            handle = self._handle(key, record, entry.revision)
            try:
                await handle.commit(record)  # the epoch bump: compare-and-set on the revision just read
            except FencedError:
                continue
            # The same task message again, not handed back on purpose: its owner died or froze holding it. Or a new
            # one a peer published for an owner gone silent (lease_mode daemon): the same, so a request that kills
            # every daemon that applies it still counts its attempts.
            unclean = (same_task and not current.handed_back) or current.reaped
            return Acquired(handle, unclean=unclean)
        raise FencedError(f"could not take change set {key} over: it kept changing")

    def _handle(self, key: str, record: ChangeSetRecord, revision: int) -> ChangeSetHandle:
        return ChangeSetHandle(
            self.kv,
            key,
            record,
            revision,
            self._requester,
            self._settings.nats_timeout,
            reads=self.reads,
        )

    @staticmethod
    def _key(change_set: ChangeSet) -> str:
        return Subjects.change_set_key(change_set.workspace_id, change_set.change_set_id)
