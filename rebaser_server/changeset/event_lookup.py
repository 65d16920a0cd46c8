"""What of one change set's events the events stream holds already: the half of the event pump
(:mod:`~rebaser_server.changeset.event_pump`) that finds it, and the queue it drops it from.

An ownership starts with what the last owner left unstored (the record's outbox), and a batch that got no answer
may have been stored: either is looked for on the change set's subject before it is sent, so that nothing is stored
twice. The subject's last message settles it when it can (a durable event, or a daemon's notice); else the subject
is read on from where the record says the events were stored, or, past :data:`_SCAN_MAX` reads, the queue goes one
event at a time under each one's ``Nats-Msg-Id``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from nats.js.errors import APIError

from rebaser_core import headers as h
from rebaser_core.api import ContentType
from rebaser_core.api.codec import decode_body
from rebaser_core.errors import ProtocolError
from rebaser_core.headers import get_header
from rebaser_core.nats.requester import Requester, js_api, last_message, last_message_direct
from rebaser_core.nats.speedups import parse_header_lines

__all__ = ["EventLookup", "Queued"]

# Messages read one by one when looking for what an unanswered batch (or the last owner) stored: the outbox bound and
# the notices between. Past it, only the subject's last message is read (_locate_by_last).
_SCAN_MAX = 512
_NO_MESSAGE = 10037
_SEQUENCE = "Nats-Sequence"  # the stream sequence a direct get's answer carries


class Queued(NamedTuple):
    """An event waiting for its turn: its durable ``seq`` (None for a notice), its JSON-model form, and the trace
    headers of the request it tells of."""

    seq: int | None
    event: dict[str, Any]
    trace: Mapping[str, str]


class EventLookup:
    """The base of :class:`~rebaser_server.changeset.event_pump.EventPump`: how it finds what the events stream
    holds already. The pump publishes, and comes here when it does not know where the subject is (an ownership's
    start, a batch that got no answer, a refusal that names the subject's last sequence)."""

    # The pump's state this reads and sets (EventPump.__init__ says what each is).
    _requester: Requester
    _stream: str
    _subject: str
    _timeout: float
    _on_stored: Callable[[int | None, bool], None]
    _queue: list[Queued]
    last: int | None
    _scan_from: int
    _singles: int

    async def _locate(self) -> None:
        """Find where the subject is, and drop from the queue what is stored already.

        First its last message, by a direct get (cheap; a replica's stale answer is caught by the next publication's
        expectation, and what it shows stored is stored). A durable event, or a daemon's notice (published after
        every durable event before it was stored), settles it: everything up to its ``seq`` is stored. An operator's
        notice does not: then the subject is read on from where the record says the events were stored."""
        found = await last_message_direct(self._requester, self._stream, self._subject, timeout=self._timeout)
        if found is None:
            self.last = 0
            return
        assert found.headers is not None  # a found message has its Nats-Sequence
        if self._settled_by(_seen_of(found.headers, found.data)):
            self.last = int(found.headers[_SEQUENCE])
        elif self._scan_from > 0:
            await self._scan(self._scan_from)
        else:
            await self._locate_by_last()

    def _settled_by(self, seen: _Seen | None) -> bool:
        """Whether ``seen`` (the subject's last message) says how far the events are stored; if so, drop those.

        A daemon's notice says so only for the events up to its own ``seq``: an owner that lost the change set (cut
        off, then back) can store a late notice after a later owner's events, with the ``seq`` it knew. So a notice
        behind a queued durable event settles nothing; the subject is read instead (seen in the partitions battery:
        a stale ``released`` notice hid the event before it, which was then stored twice)."""
        if seen is None or not (seen.durable or seen.owner not in ("", "operator")):
            return False
        if not seen.durable and any(q.seq is not None and q.seq > seen.seq for q in self._queue):
            return False
        self._drop(lambda q: (q.seq is not None and q.seq <= seen.seq) or q.event.get("id") == seen.id)
        return True

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
            seen = _seen_in(message)
            if seen is not None:
                seen_ids.add(seen.id)
                if seen.durable:
                    durable = max(durable, seen.seq)
        self.last = last if until is None else max(last, until)
        self._scan_from = 0
        self._drop(lambda q: str(q.event.get("id")) in seen_ids or (q.seq is not None and q.seq <= durable))

    async def _locate_by_last(self) -> None:
        """The subject's last message as the stream leader has it, when nothing else tells: settled as in
        :meth:`_locate`, or, after an operator's notice, the queue is published one event at a time under each
        one's ``Nats-Msg-Id`` (a repeat is dropped by the stream's duplicate window, or by the follower, by
        ``seq``)."""
        message = await last_message(self._requester, self._stream, self._subject, timeout=self._timeout)
        if message is None:
            self.last = 0
            return
        self.last = int(message["seq"])
        if not self._settled_by(_seen_in(message)):
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


class _Seen(NamedTuple):
    """What the publisher needs of a stored event: no model is built for it (a scan may read hundreds)."""

    id: str
    durable: bool
    seq: int
    owner: str


def _seen_of(headers: Mapping[str, str] | None, data: bytes) -> _Seen | None:
    """A stored message as an event's id, kind of event, seq and owner; None if it is not an event."""
    try:
        content_type = ContentType.parse(get_header(headers, h.CONTENT_TYPE) or ContentType.CBOR.value)
        body = decode_body(data, content_type)
    except (ProtocolError, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    ident, durable, seq, owner = body.get("id"), body.get("durable"), body.get("seq"), body.get("owner", "")
    if not (
        isinstance(ident, str) and isinstance(durable, bool) and type(seq) is int and isinstance(owner, str)
    ):
        return None
    return _Seen(ident, durable, seq, owner)


def _seen_in(message: Mapping[str, Any]) -> _Seen | None:
    """A ``STREAM.MSG.GET`` message as :func:`_seen_of` reads it."""
    raw = message.get("hdrs")
    try:
        headers = parse_header_lines(base64.b64decode(raw)) if raw else None
        return _seen_of(headers, base64.b64decode(message.get("data") or ""))
    except ValueError:
        return None
