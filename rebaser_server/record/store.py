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

The record's form (its fields, encoding and decoding) is ``rebaser_server.record.model``; this module reads it
and takes a change set over, and the owner commits through the handle it gets (``rebaser_server.record.handle``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from rebaser_core.errors import FencedError
from rebaser_core.nats.requester import Requester
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.app import AppState, ChangeSet
from rebaser_server.record.direct_reads import DirectReads
from rebaser_server.record.handle import ChangeSetHandle, read_last, update_with_headers
from rebaser_server.record.model import ChangeSetRecord
from rebaser_server.task.delivery import Delivery

__all__ = [
    "Acquired",
    "ChangeSetStore",
    "NothingToDo",
    "StaleDelivery",
    "StillSilent",
    "TaskDelivery",
]

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
        entry = await read_last(self.kv, key, self.reads, self._settings.nats_timeout)
        if entry is None or entry.value is None:
            return None
        record = entry.record()
        if record.owner != owner or not record.task_seq or record.reaped:
            return None  # (reaped: by a peer, or by the owner itself before its own hand-back)
        if still_silent is not None and not await still_silent():
            return None
        try:
            marked = replace(record, reaped=True)
            await update_with_headers(self.kv, key, marked.encode(), entry.revision, marked.feed_header(0))
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
            entry = await read_last(self.kv, key, self.reads, self._settings.nats_timeout)
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
