"""One change set's events, stored in the events stream in the order they were decided, whatever fails.

The feed promises a follower that a change set's events come in ``seq`` order, so a jump in ``seq`` is a real loss
(rebaser_core.api.events). Publishing each event as it comes, with its acknowledgement to a callback, breaks that
promise whenever one publication fails and a later one succeeds: the failed one is stored after it. So the events
of one change set go out one batch at a time:

- Everything queued since the last batch goes in the next one (at most :data:`MAX_BATCH`), as one JetStream atomic
  batch (ADR-50: all of it is stored or none, contiguously, with one acknowledgement): under load a batch holds a
  commit group's events and more, and costs the server and this daemon one acknowledgement instead of one each.
- Its first message carries ``Nats-Expected-Last-Subject-Sequence``: the stream stores the batch only right after
  the last message this publisher knows of on the subject. Nothing can be stored in between, or twice: a refusal
  says what the subject's last sequence is now, and an unanswered batch is looked for in the stream before it is
  sent again (:meth:`EventPump._settle`).

Nothing waits for this on the request path: the caller queues and goes on (:meth:`EventPump.put`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
import secrets
from collections.abc import Callable, Mapping
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.js.errors import APIError

from rebaser_core import headers as h
from rebaser_core.api import CHANGE_SET_EVENT, ChangeSetEvent, ContentType, event_msg_id
from rebaser_core.api.codec import encode_body
from rebaser_core.errors import ProtocolError
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.pub_ack import read_pub_ack
from rebaser_core.nats.requester import Requester, js_api, last_message
from rebaser_core.nats.speedups import parse_header_lines

__all__ = ["MAX_BATCH", "EventPump", "Queued"]

log = logging.getLogger(__name__)

# Events in one atomic batch (the server takes up to 1,000; events are under 8 KiB each).
MAX_BATCH = 128
# Messages read one by one when looking for what an unanswered batch (or the last owner) stored: the outbox bound and
# the notices between. Past it, only the subject's last message is read (_locate_by_last).
_SCAN_MAX = 512
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 2.0
_WRONG_LAST = 10071  # "wrong last sequence: N"
_ATOMIC_OFF = (10174,)  # "atomic publish is disabled" on the stream: publish one at a time
_NO_MESSAGE = 10037
_WRONG_LAST_TEXT = re.compile(r"wrong last sequence: (\d+)")


class Queued:
    """An event waiting for its turn: its JSON-model form, its durable ``seq`` (None for a notice), and the trace
    headers of the request it tells of."""

    __slots__ = ("event", "seq", "trace")

    def __init__(self, seq: int | None, event: dict[str, Any], trace: Mapping[str, str]) -> None:
        self.seq, self.event, self.trace = seq, event, trace


class _Refused(Exception):
    def __init__(self, code: int, description: str) -> None:
        super().__init__(f"{description} (err_code {code})")
        self.code, self.description = code, description


class EventPump:
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
        # The stream sequence of the subject's last message as far as this publisher knows (None: to be found).
        self.last: int | None = None
        self._scan_from = 0  # where to look from when ``last`` is to be found (the record's ``events_at``)
        self._atomic = True
        # Queued events to send one at a time, each with its Nats-Msg-Id (see _locate_by_last).
        self._singles = 0
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    # -- the caller's side ----------------------------------------------------------------------------
    def start_after(self, stream_seq: int) -> None:
        """Before the first :meth:`put` of an ownership: the last owner knew everything up to ``stream_seq`` on the
        subject to be stored (0: not known; then the subject's last message tells)."""
        self.last, self._scan_from = None, stream_seq

    def put(self, item: Queued) -> None:
        self._queue.append(item)
        self._idle.clear()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def pending(self) -> list[Queued]:
        """What is queued or in flight, oldest first."""
        return list(self._queue)

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
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    # -- publishing -----------------------------------------------------------------------------------
    async def _run(self) -> None:
        failures = 0
        while self._queue:
            try:
                if self.last is None:
                    await self._locate()
                    continue
                batch = self._queue[:MAX_BATCH] if self._atomic and not self._singles else self._queue[:1]
                self._in_flight = len(batch)
                try:
                    stored_at = await self._send(batch, self.last)
                finally:
                    self._in_flight = 0
            except _Refused as err:
                if err.code == _WRONG_LAST and (found := _WRONG_LAST_TEXT.search(err.description)):
                    # Someone else published on the subject (an operator's notice, an owner before or after
                    # this one): nothing of the batch was stored. What they stored of ours is dropped.
                    await self._scan(self.last or 0, until=int(found[1]))
                    continue
                if err.code in _ATOMIC_OFF and self._atomic:
                    log.warning(
                        "%s: the events stream takes no atomic batches: one event at a time", self._stream
                    )
                    self._atomic = False
                    continue
                failures = await self._failed(err, failures)
                continue
            except (nats.errors.Error, TimeoutError, OSError, APIError) as err:
                failures = await self._failed(err, failures)
                if self.last is not None:
                    # Unanswered: the batch may be stored. Look before sending it again.
                    with contextlib.suppress(nats.errors.Error, TimeoutError, OSError, APIError):
                        await self._scan(self.last)
                continue
            failures = 0
            # (A single event the duplicate window knew is acknowledged with the first one's sequence, which may
            # be older: the next batch is then refused with the real one, and goes on from there.)
            self.last = stored_at
            self._singles = max(self._singles - len(batch), 0)
            del self._queue[: len(batch)]
            for item in batch:
                self._on_stored(item.seq, True)
        self._idle.set()

    async def _failed(self, err: Exception, failures: int) -> int:
        self._on_failure(err)
        await asyncio.sleep(min(_BACKOFF_FIRST * 2**failures, _BACKOFF_MAX))
        return failures + 1

    async def _send(self, batch: list[Queued], after: int) -> int:
        """Publish ``batch`` to be stored right after stream sequence ``after``; the last one's stream sequence."""
        last = len(batch) - 1
        bodies = [encode_body(item.event, ContentType.CBOR) for item in batch]
        batch_id = secrets.token_hex(12) if last else ""
        for i, item in enumerate(batch):
            headers = {
                h.CONTENT_TYPE: ContentType.CBOR.value,
                h.MESSAGE_TYPE: CHANGE_SET_EVENT.name,
                h.MESSAGE_VERSION: "1",
                **item.trace,
            }
            if i == 0:
                headers["Nats-Expected-Last-Subject-Sequence"] = str(after)
            if batch_id:
                # (No Nats-Msg-Id in a batch: the server refuses a whole batch that repeats one.)
                headers.update({"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(i + 1)})
            elif item.seq is not None:
                headers[h.NATS_MSG_ID] = event_msg_id(*self._ids, item.seq)
            if i < last:
                await self._requester.publish(self._subject, bodies[i], headers=headers)
                continue
            if batch_id:
                headers["Nats-Batch-Commit"] = "1"
            reply = await self._requester.request(
                self._subject, bodies[i], timeout=self._timeout, headers=headers
            )
            return _stored_seq(reply)
        raise AssertionError("an empty batch")

    # -- finding what is stored -----------------------------------------------------------------------
    async def _locate(self) -> None:
        """Find the subject's last stored message, and drop from the queue what is stored already."""
        if self._scan_from > 0:
            await self._scan(self._scan_from)
        else:
            await self._locate_by_last()

    async def _scan(self, after: int, *, until: int | None = None) -> None:
        """Read the subject's messages after stream sequence ``after`` (up to ``until``, or the last), drop from
        the queue every event among them, and know the last one's sequence."""
        seen_ids: set[str] = set()
        durable = 0
        reads = 0
        last = after
        while until is None or last < until:
            if reads >= _SCAN_MAX:
                await self._locate_by_last()
                return
            reads += 1
            try:
                answer = await js_api(
                    self._requester,
                    f"STREAM.MSG.GET.{self._stream}",
                    {"seq": last + 1, "next_by_subj": self._subject},
                    timeout=self._timeout,
                )
            except APIError as err:
                if err.err_code == _NO_MESSAGE:
                    break
                raise
            message = answer["message"]
            last = int(message["seq"])
            event = _event_of(message)
            if event is not None:
                seen_ids.add(str(event.id))
                if event.durable:
                    durable = max(durable, event.seq)
        self.last = last if until is None else max(last, until)
        self._scan_from = 0
        self._drop(lambda q: str(q.event.get("id")) in seen_ids or (q.seq is not None and q.seq <= durable))

    async def _locate_by_last(self) -> None:
        """Without a place to read from: the subject's last message. A durable event, or a notice this daemon's
        kind published (after every durable event before it was stored), says how far the events are stored; an
        operator's notice does not, and the queue is published as it is (a repeat is dropped by the stream's
        duplicate window or by the follower, by ``seq``)."""
        message = await last_message(self._requester, self._stream, self._subject, timeout=self._timeout)
        if message is None:
            self.last = 0
            return
        self.last = int(message["seq"])
        event = _event_of(message)
        if event is not None and (event.durable or event.owner not in ("", "operator")):
            stored, stored_id = event.seq, str(event.id)
            self._drop(lambda q: (q.seq is not None and q.seq <= stored) or q.event.get("id") == stored_id)
        else:
            # The stream may hold some of the queue: each event goes alone, with its Nats-Msg-Id, until the queue
            # has been through once.
            self._singles = len(self._queue)

    def _drop(self, stored: Callable[[Queued], bool]) -> None:
        """Drop from the queue what the stream is found to hold already (stored by an earlier attempt or owner)."""
        kept = []
        for item in self._queue:
            if stored(item):
                self._on_stored(item.seq, False)
            else:
                kept.append(item)
        self._queue = kept


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


def _event_of(message: Mapping[str, Any]) -> ChangeSetEvent | None:
    """A ``STREAM.MSG.GET`` message as an event, or None if it is not one."""
    raw = message.get("hdrs")
    try:
        headers = parse_header_lines(base64.b64decode(raw)) if raw else None
        return CHANGE_SET_EVENT.decode(headers, base64.b64decode(message.get("data") or ""))
    except (ProtocolError, ValueError):
        return None
