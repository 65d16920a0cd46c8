"""One change set's events, stored in the events stream in the order they were decided, whatever fails.

The feed promises a follower that a change set's events come in ``seq`` order, so a jump in ``seq`` is a real loss
(rebaser_core.api.events). Publishing each event as it comes, with its acknowledgement to a callback, breaks that
promise whenever one publication fails and a later one succeeds: the failed one is stored after it. So the events
of one change set go out one batch at a time:

- One event at a time while they come slower than acknowledgements; once :data:`BATCH_FROM` wait, everything queued
  goes in the next one (at most :data:`MAX_BATCH`), as one JetStream atomic batch (ADR-50: all of it is stored or
  none, contiguously, with one acknowledgement). A batch costs nats-server about 1.2 ms of CPU whatever its size, an
  event alone 10 µs, so batches are only for a backlog, where they keep one busy change set's feed from falling
  behind (one event per round trip would).
- Its first message carries ``Nats-Expected-Last-Subject-Sequence``: the stream stores the batch only right after
  the last message this publisher knows of on the subject. Nothing can be stored in between, or twice: a refusal
  says what the subject's last sequence is now, and an unanswered batch is looked for in the stream before it is
  sent again (:mod:`~rebaser_server.changeset.event_lookup`).

Nothing waits for this on the request path: the caller queues and goes on (:meth:`EventPump.put`). With nothing in
flight the batch is sent at once and its acknowledgement comes to a callback; a task runs only to look for what is
stored, after a failure, or while events come faster than one batch per round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import secrets
import time
from collections.abc import Callable

import nats.errors
from nats.aio.msg import Msg
from nats.js.errors import APIError

from rebaser_core import headers as h
from rebaser_core.api import CHANGE_SET_EVENT, ContentType, event_msg_id
from rebaser_core.api.codec import encode_body
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.pub_ack import read_pub_ack
from rebaser_core.nats.requester import Requester
from rebaser_server.changeset.event_lookup import EventLookup, Queued

__all__ = ["MAX_BATCH", "EventPump"]

log = logging.getLogger(__name__)

# Events in one atomic batch (the server takes up to 1,000; events are under 8 KiB each), and the backlog from which
# one is sent (below it, one event at a time: see _next_batch).
MAX_BATCH = 128
BATCH_FROM = 32
# Notices (no durable seq: dvu_started, paused, taken, …) waiting to be published, at most; past it the oldest waiting
# go. Durable events are bounded by the outbox (OUTBOX_MAX, give_up_before); notices are best effort, and without a
# bound they would pile up for as long as the events stream refuses them and the change set stays owned.
MAX_QUEUED_NOTICES = 64
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 2.0
_WRONG_LAST = 10071  # "wrong last sequence: N"
_ATOMIC_OFF = (10174,)  # "atomic publish is disabled" on the stream: publish one at a time
# A batch refused whole for a limit ("incomplete": messages of it dropped past the server's 50 batches in flight per
# stream): nothing stored; one event at a time for _BATCHES_PAUSE seconds.
_BATCH_REFUSED = (10176,)
_BATCHES_PAUSE = 5.0
_WRONG_LAST_TEXT = re.compile(r"wrong last sequence: (\d+)")


class _Refused(Exception):
    def __init__(self, code: int, description: str) -> None:
        super().__init__(f"{description} (err_code {code})")
        self.code, self.description = code, description


class EventPump(EventLookup):
    """The ordered publisher of one change set's events (see the module's docstring)."""

    def __init__(
        self,
        requester: Requester,
        *,
        stream: str,
        subject: str,
        ids: tuple[WorkspacePk, ChangeSetId],
        timeout: float,
        on_stored: Callable[[int | None, bool], None],
        on_failure: Callable[[Exception], None],
    ) -> None:
        self._requester = requester
        self._stream, self._subject, self._ids = stream, subject, ids
        self._timeout = timeout
        self._on_stored, self._on_failure = on_stored, on_failure
        self._queue: list[Queued] = []
        self._in_flight = 0  # the first so many of the queue are being sent
        self.notices_dropped = 0  # notices dropped waiting, past MAX_QUEUED_NOTICES
        # The stream sequence of the subject's last message as far as this publisher knows (None: to be found).
        self.last: int | None = None
        self._scan_from = 0  # where to look from when ``last`` is to be found (the record's ``events_at``)
        # Queued events to send one at a time, each with its Nats-Msg-Id (see _locate_by_last).
        self._singles = 0
        self._fresh = False  # see start_after
        self._batches_after = 0.0  # monotonic; no batch before (inf: none ever): see _recover
        self._closed = False
        # Locating, recovering from a failure, or a backlog: the publishing goes on in a task (none otherwise).
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    # -- the caller's side ----------------------------------------------------------------------------
    def start_after(self, stream_seq: int, *, fresh: bool = False) -> None:
        """Before the first :meth:`put` of an ownership: the last owner knew everything up to ``stream_seq`` on the
        subject to be stored (0: not known; then the subject's last message tells). ``fresh``: the ownership took
        over no unstored event (the record's outbox is empty), so nothing needs looking for: the first batch goes
        without an expectation, and its acknowledgement says where the subject is."""
        self.last, self._scan_from, self._fresh = None, stream_seq, fresh

    def enqueue(self, item: Queued) -> None:
        """Queue ``item`` from where nothing can wait: a task publishes it."""
        self._queue.append(item)
        self._bound_notices()
        self._idle.clear()
        if not self._in_flight:
            self._drive()

    async def put(self, *items: Queued) -> None:
        """Queue ``items``; publish them now if nothing is in flight (the acknowledgement comes to a callback: no
        task, no wait). Otherwise they go in the next batch."""
        self._queue.extend(items)
        self._bound_notices()
        self._idle.clear()
        if self._in_flight or self._closed or (self._task is not None and not self._task.done()):
            return
        if self.last is None and not self._fresh:
            self._drive()  # to be located first
            return
        batch = self._next_batch()
        self._in_flight = len(batch)
        try:
            await self._publish(batch, self.last, on_answer=self._answered)
        except (nats.errors.Error, OSError) as err:
            self._answered(err)

    def _bound_notices(self) -> None:
        """Keep at most MAX_QUEUED_NOTICES notices waiting (those in flight go on): the oldest waiting go first."""
        if len(self._queue) - self._in_flight <= MAX_QUEUED_NOTICES:
            return  # (cannot be over: the usual case, at no cost)
        keep = self._queue[: self._in_flight]
        rest = self._queue[len(keep) :]
        over = sum(1 for q in rest if q.seq is None) - MAX_QUEUED_NOTICES
        if over <= 0:
            return
        kept = []
        for item in rest:
            if item.seq is None and over > 0:
                over -= 1
                self.notices_dropped += 1
            else:
                kept.append(item)
        self._queue = keep + kept

    def give_up_before(self, seq: int) -> None:
        """Drop the durable events before ``seq`` still queued (they are no longer in any outbox): a follower sees
        the gap. Those in flight go on."""
        keep = self._queue[: self._in_flight]
        rest = self._queue[len(keep) :]
        self._queue = keep + [q for q in rest if q.seq is None or q.seq >= seq]

    async def drained(self, timeout: float) -> bool:
        """Wait until everything queued is stored (at most ``timeout`` seconds); whether it was."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        return self._idle.is_set()

    def close(self) -> None:
        """Stop publishing (the ownership is over; what is queued and committed is the next owner's, by the
        record's outbox)."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    # -- publishing -----------------------------------------------------------------------------------
    def _next_batch(self) -> list[Queued]:
        # An atomic batch costs nats-server about 1.2 ms of CPU whatever its size (bench/event_batches.py): one
        # event alone costs 10 µs. So one at a time, and a batch only once a backlog makes it pay for itself.
        if not self._singles and len(self._queue) >= BATCH_FROM and time.monotonic() >= self._batches_after:
            return self._queue[:MAX_BATCH]
        return self._queue[:1]

    def _answered(self, answer: Msg | Exception) -> None:
        """The acknowledgement of the batch :meth:`put` sent (in nats-py's read loop: quick, no wait)."""
        count, self._in_flight = self._in_flight, 0
        if self._closed:
            return
        try:
            if isinstance(answer, Exception):
                raise answer
            stored_at = _stored_seq(answer)
        except Exception as err:
            self._drive(err)  # looked into, and sent again, by a task
            return
        self._stored(count, stored_at)
        if self._queue:
            self._drive()  # more came meanwhile: the next batch (a task only under load)
        else:
            self._idle.set()

    def _stored(self, count: int, stored_at: int) -> None:
        # (A single event the duplicate window knew is acknowledged with the first one's sequence, which may be
        # older: the next batch is then refused with the real one, and goes on from there.)
        self.last, self._fresh = stored_at, False
        self._singles = max(self._singles - count, 0)
        batch, self._queue = self._queue[:count], self._queue[count:]
        for item in batch:
            self._on_stored(item.seq, True)

    def _drive(self, failure: Exception | None = None) -> None:
        if not self._closed and (self._task is None or self._task.done()):
            self._task = asyncio.ensure_future(self._run(failure))

    async def _run(self, failure: Exception | None) -> None:
        """Publish what is queued, one batch at a time, through whatever fails (after ``failure``, first)."""
        failures = 0
        while failure is not None or self._queue:
            if failure is not None:
                err, failure = failure, None
                failures = await self._recover(err, failures)
                continue
            try:
                if self.last is None and not self._fresh:
                    await self._locate()
                    continue
                batch = self._next_batch()
                self._in_flight = len(batch)
                try:
                    reply = await self._publish(batch, self.last)
                finally:
                    self._in_flight = 0
                assert reply is not None
                stored_at = _stored_seq(reply)
            except (_Refused, nats.errors.Error, TimeoutError, OSError, APIError) as err:
                failure = err
                continue
            failures = 0
            self._stored(len(batch), stored_at)
        self._idle.set()

    async def _recover(self, err: Exception, failures: int) -> int:
        """After a batch failed: find out what is stored now; the failures in a row so far."""
        if isinstance(err, _Refused):
            if err.code == _WRONG_LAST and (found := _WRONG_LAST_TEXT.search(err.description)):
                # Someone else published on the subject (an operator's notice, an owner before or after this one):
                # nothing of the batch was stored. What they stored of ours is dropped.
                with contextlib.suppress(nats.errors.Error, TimeoutError, OSError, APIError):
                    await self._scan(self.last or 0, until=int(found[1]))
                return failures
            if err.code in _ATOMIC_OFF:
                log.warning(
                    "%s: the events stream takes no atomic batches: one event at a time", self._stream
                )
                self._batches_after = math.inf  # never again
                return failures
            if err.code in _BATCH_REFUSED:
                # Nothing stored. The server's limit of batches in flight (50 per stream, all daemons together) is
                # reached: one event at a time for a while, which keeps the order and goes on.
                self._batches_after = time.monotonic() + _BATCHES_PAUSE
                return failures
            return await self._failed(err, failures)  # refused: nothing stored
        failures = await self._failed(err, failures)
        if self.last is not None:
            # Unanswered: the batch may be stored. Look before sending it again.
            with contextlib.suppress(nats.errors.Error, TimeoutError, OSError, APIError):
                await self._scan(self.last)
        elif self._fresh:
            self._fresh = (
                False  # where the subject is, and whether the batch is stored: its last message says
            )
        return failures

    async def _failed(self, err: Exception, failures: int) -> int:
        self._on_failure(err)
        await asyncio.sleep(min(_BACKOFF_FIRST * 2**failures, _BACKOFF_MAX))
        return failures + 1

    async def _publish(
        self,
        batch: list[Queued],
        after: int | None,
        on_answer: Callable[[Msg | Exception], None] | None = None,
    ) -> Msg | None:
        """Publish ``batch`` to be stored right after stream sequence ``after`` (None: after whatever is there).
        The acknowledgement goes to ``on_answer``, or is returned."""
        last = len(batch) - 1
        batch_id = secrets.token_hex(12) if last else ""
        for i, item in enumerate(batch):
            headers = {
                h.CONTENT_TYPE: ContentType.CBOR.value,
                h.MESSAGE_TYPE: CHANGE_SET_EVENT.name,
                h.MESSAGE_VERSION: "1",
                **item.trace,
            }
            if i == 0 and after is not None:
                headers["Nats-Expected-Last-Subject-Sequence"] = str(after)
            if batch_id:
                headers.update({"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(i + 1)})
            elif self._singles and item.seq is not None:
                # Only where the stream may hold it already (see _locate_by_last): the expectation keeps everything
                # else from being stored twice, and the server keeps each id for duplicate_window (minutes).
                headers[h.NATS_MSG_ID] = event_msg_id(*self._ids, item.seq)
            body = encode_body(item.event, ContentType.CBOR)
            if i < last:
                await self._requester.publish(self._subject, body, headers=headers)
                continue
            if batch_id:
                headers["Nats-Batch-Commit"] = "1"
            if on_answer is not None:
                await self._requester.send(
                    self._subject, body, timeout=self._timeout, headers=headers, on_answer=on_answer
                )
                return None
            return await self._requester.request(self._subject, body, timeout=self._timeout, headers=headers)
        raise AssertionError("an empty batch")


def _stored_seq(reply: Msg) -> int:
    try:
        ack = read_pub_ack(reply.data)
    except ValueError:
        raise _Refused(0, f"unreadable JetStream reply {reply.data[:80]!r}") from None
    if not isinstance(ack, dict):
        raise _Refused(0, f"unreadable JetStream reply {reply.data[:80]!r}")
    error = ack.get("error")
    if error is not None:
        raise _Refused(int(error.get("err_code", 0)), str(error.get("description", "")))
    return int(ack.get("seq", 0))
