"""One owner's handle on a change set's record: its commits by compare-and-set (the fence), the read back of a write
whose answer was lost, and the KV reads and writes they are made of (the store's takeover and reaped mark are made
of them too).

:meth:`rebaser_server.record.store.ChangeSetStore.acquire` makes a handle when it takes a change set over; the
owner commits through it from then on. A commit is a compare-and-set on the revision this owner last wrote, so a
commit after another owner wrote raises :class:`~rebaser_core.errors.FencedError`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import nats.errors
from nats.js.errors import APIError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from rebaser_core.errors import FencedError
from rebaser_core.headers import get_header
from rebaser_core.nats.pub_ack import read_pub_ack
from rebaser_core.nats.requester import Requester
from rebaser_server.record.direct_reads import DirectReads
from rebaser_server.record.model import ChangeSetRecord

__all__ = ["ChangeSetHandle", "read_last", "update_with_headers"]

log = logging.getLogger(__name__)

# The header a compare-and-set write carries, and the error JetStream answers when the key moved on.
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
_WRONG_LAST_SEQUENCE = 10071
_KV_OPERATION = "KV-Operation"


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
            return await update_with_headers(self._kv, self.key, value, self.revision, headers)
        return await self._update(value, headers)

    async def _own_write_landed(self, value: bytes) -> bool:
        """Whether the record stored now is ``value``, the write of this owner that got no answer; if so, its
        revision becomes the one the next write expects."""
        entry = await read_last(self._kv, self.key, self._reads, self._timeout)
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
        entry = await read_last(self._kv, self.key, self._reads, self._timeout)
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


async def update_with_headers(
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


async def read_last(kv: KeyValue, key: str, reads: DirectReads | None, timeout: float) -> _Entry | None:
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
