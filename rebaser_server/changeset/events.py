"""The event feed of one owned change set (rebaser_core.api.events): decided with the commit, and carried by it.

A commit group's durable events are numbered from the record's ``events`` counter and join the record's window of
last events (``feed``), which the commit's write carries in its ``Rebaser-Events`` header
(rebaser_core.api.event_window): an event is stored exactly when its commit is, and followers read it from the
change-sets bucket's stream. That is the feed, and it costs no message of its own.

With ``events`` on (for followers of earlier releases), the same events and the notices are also published to the
``REBASER_EVENTS`` stream. There they are written into the record that is committed (``outbox``), *then*
published: an owner fenced at the commit publishes nothing, and an owner that dies between the commit and the
publication leaves them in the record for the next owner, who publishes what the stream does not hold yet
(:meth:`ChangeSetFeed.taken`). Publication never waits on the request path, and the stream stores one change set's
events in the order they were decided, whatever fails (:mod:`~rebaser_server.changeset.event_pump`). While
unstored, an event stays in the outbox of every commit (at most :data:`OUTBOX_MAX`; beyond that the oldest are
given up, and a follower sees the gap in ``seq``). The record also keeps ``events_at``, the stream sequence up to
which the events were known stored, where the next owner starts looking.

Notices (taken, released, DVU started or failed) are not committed: published to the stream only, once, in order
with the rest, on this owner's word.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from nats.aio.msg import Msg

from rebaser_core.api import (
    CHANGE_SET_EVENT,
    DURABLE_KINDS,
    ConflictsStatus,
    EventKind,
    SuccessStatus,
    event_text,
    reason_class,
)
from rebaser_core.api.event_window import STATUS_OF_KIND
from rebaser_core.ids import RequestId
from rebaser_core.nats.requester import Requester
from rebaser_core.subjects import Subjects
from rebaser_core.tracing import TRACE_HEADERS
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.context import Stats
from rebaser_server.changeset.decisions import Decision, Kind
from rebaser_server.changeset.event_lookup import Queued
from rebaser_server.changeset.event_pump import EventPump
from rebaser_server.changeset.event_texts import SETTLED, dvu_text, outcome_text
from rebaser_server.record.model import ChangeSetRecord

__all__ = ["OUTBOX_MAX", "ChangeSetFeed"]

log = logging.getLogger(__name__)

# Unacknowledged durable events carried in the record: a NATS outage longer than a few groups gives up the oldest
# (the record must stay small: it is written on every commit).
OUTBOX_MAX = 256

# A status -> its outcome event's kind (the table a window's reader uses the other way round).
_STATUS_KIND: dict[str, EventKind] = {status: kind for kind, status in STATUS_OF_KIND.items()}


class ChangeSetFeed:
    """What one owned change set tells its followers. ``window``: the last durable events each write of the record
    carries (0: none); ``enabled``: the events and notices are published to the events stream as well."""

    def __init__(
        self,
        change_set: ChangeSet,
        *,
        requester: Requester,
        subjects: Subjects,
        owner: str,
        stats: Stats,
        timeout: float,
        enabled: bool,
        window: int = 0,
    ) -> None:
        self._change_set = change_set
        self._owner = owner
        self._stats = stats
        self._timeout = timeout
        self.enabled = enabled
        self._window = window
        self._epoch = 0
        self._seq = 0  # the last durable event's seq (committed)
        # seq -> durable events (their JSON-model form) queued and not yet stored, oldest first: the outbox.
        self._unconfirmed: dict[int, dict[str, Any]] = {}
        self._staged: list[tuple[int, dict[str, Any], dict[str, str]]] = []
        self._staged_seq = 0  # the events stream off: the last seq the record staged last holds
        self._pump = EventPump(
            requester,
            stream=subjects.events_stream,
            subject=subjects.events(change_set.workspace_id, change_set.change_set_id),
            ids=(change_set.workspace_id, change_set.change_set_id),
            timeout=timeout,
            # Closures over the outbox and the counters, not methods of the feed: a feed and its publisher that held
            # each other would be freed only by the cycle collector.
            on_stored=_on_stored(self._unconfirmed, stats),
            on_failure=_on_failure(change_set, stats),
        )

    # -- durable events -------------------------------------------------------------------------------
    def stage(
        self,
        record: ChangeSetRecord,
        decisions: Iterable[Decision],
        queued: Iterable[int],
        *,
        settled: bool,
    ) -> ChangeSetRecord:
        """``record`` (about to be committed) with the events of ``decisions`` numbered and in its outbox.
        ``queued``: the requests already waiting behind each decision; ``settled``: nothing is queued behind the
        last one and no DVU is due (its event says so)."""
        if not self.enabled:
            if not self._window:
                return record
            seq, epoch, texts = record.events, self._epoch, []
            for decision, waiting in zip(decisions, queued, strict=True):
                text = outcome_text(decision, waiting, epoch, seq + 1)
                if text is not None:
                    seq += 1
                    texts.append(text)
            return self._stage_window(record, seq, texts, settled)
        events = [
            event
            for decision, waiting in zip(decisions, queued, strict=True)
            if (event := self._outcome(decision, waiting)) is not None
        ]
        return self._stage(record, events, settled)

    def stage_dvu(self, record: ChangeSetRecord, duration: float, *, settled: bool) -> ChangeSetRecord:
        """``record`` (a DVU run's, about to be committed) with its ``dvu_finished`` event."""
        if not self.enabled:
            if not self._window:
                return record
            seq = record.events + 1
            return self._stage_window(record, seq, [dvu_text(duration, self._epoch, seq)], settled)
        return self._stage(
            record, [(self._event("dvu_finished", duration_s=round(duration, 6)), {})], settled
        )

    def _stage_window(
        self, record: ChangeSetRecord, seq: int, texts: list[str], settled: bool
    ) -> ChangeSetRecord:
        """The events stream off: ``record`` with ``texts`` (its events ``record.events + 1`` to ``seq``, as the
        window carries them) in its window."""
        self._staged_seq = seq
        if not texts:
            return record
        if settled:
            texts[-1] = texts[-1][:-1] + SETTLED
        feed, cut = record.feed, len(record.feed) + len(texts) - self._window
        return record.with_feed(seq, (feed[cut:] if cut > 0 else feed) + tuple(texts))

    def _stage(
        self, record: ChangeSetRecord, events: list[tuple[dict[str, Any], dict[str, str]]], settled: bool
    ) -> ChangeSetRecord:
        self._staged = []
        seq = record.events
        for fields, trace in events:
            seq += 1
            fields["seq"] = seq
            self._staged.append((seq, fields, trace))
        if settled and events:
            events[-1][0]["settled"] = True
        if self._window and events:
            record = record.with_feed(
                seq, (*record.feed, *(event_text(event) for _, event, _ in self._staged))[-self._window :]
            )
        if not self.enabled:
            return record
        stored_at = record.events_at if self._pump.last is None else self._pump.last
        if not self._staged and not self._unconfirmed:
            if not record.outbox and stored_at == record.events_at:
                return record
            return replace(record, outbox=(), events_at=stored_at)
        outbox = [*self._unconfirmed.values(), *(event for _, event, _ in self._staged)][-OUTBOX_MAX:]
        return replace(record, events=seq, outbox=tuple(outbox), events_at=stored_at)

    async def committed(self) -> None:
        """The record staged last is committed: queue its events (published in the background, in order)."""
        if not self.enabled:
            self._seq = max(self._seq, self._staged_seq)
            return
        staged, self._staged = self._staged, []
        for seq, event, _ in staged:
            self._unconfirmed[seq] = event
            self._seq = seq
        if staged:
            await self._pump.put(*(Queued(seq, event, trace) for seq, event, trace in staged))
        if len(self._unconfirmed) > OUTBOX_MAX:  # given up: no longer in any outbox
            for dropped in list(self._unconfirmed)[: len(self._unconfirmed) - OUTBOX_MAX]:
                del self._unconfirmed[dropped]
            self._pump.give_up_before(next(iter(self._unconfirmed)))

    async def adopted(self, record: ChangeSetRecord) -> None:
        """``record`` is this owner's after all: a commit that got no answer was found stored later (its staged
        events were dropped then). Queue the events of its outbox not queued yet, and number on from it."""
        if not self.enabled:
            self._seq = max(self._seq, record.events)
            return
        late = sorted(
            (seq, dict(e))
            for e in record.outbox
            if (seq := _seq_of(e)) is not None and seq > self._seq and seq not in self._unconfirmed
        )
        for seq, event in late:
            self._unconfirmed[seq] = event
        self._seq = max(self._seq, record.events)
        if late:
            await self._pump.put(*(Queued(seq, event, {}) for seq, event in late))

    def dropped(self) -> None:
        """The record staged last was not committed (fenced, failed): its events never happened."""
        self._staged, self._staged_seq = [], 0

    def _outcome(self, decision: Decision, queued: int) -> tuple[dict[str, Any], dict[str, str]] | None:
        response = decision.response
        if response is None or not decision.processed or decision.record is None:
            return None  # answered from the record (evented when first processed), or nothing decided yet
        if decision.kind is Kind.REPLAYED:
            return None
        status = response.status
        if decision.dead_letter is not None:
            fields = self._event("dead_lettered", reason=reason_class(decision.dead_letter))
        else:
            fields = self._event(_STATUS_KIND[status.kind])
        fields["request_id"] = str(response.id)
        fields["status"] = status.kind
        fields["queued"] = queued
        # By type, not getattr: a missing attribute of a pydantic model is a slow exception.
        if type(status) is SuccessStatus:
            fields["updates_performed"] = status.updates_performed
            if status.snapshot_address is not None:
                fields["snapshot_address"] = status.snapshot_address[:512]
        elif type(status) is ConflictsStatus:
            fields["conflicts"] = len(status.conflicts)
        return fields, _trace_of(decision.msg)

    # -- notices ------------------------------------------------------------------------------------
    def taken(self, record: ChangeSetRecord) -> None:
        """The change set is acquired with ``record``: publish what the last owner left in the outbox and the
        stream does not hold yet, then say ``taken`` (in the background, off the cold path)."""
        self._epoch, self._seq = record.epoch, record.events
        if not self.enabled:
            return
        left = sorted(
            ((seq, dict(e)) for e in record.outbox if (seq := _seq_of(e)) is not None), key=lambda x: x[0]
        )
        self._pump.start_after(record.events_at, fresh=not left)
        for seq, event in left:
            self._unconfirmed[seq] = event
            self._pump.enqueue(Queued(seq, event, {}))
        self._pump.enqueue(Queued(None, self._notice("taken"), {}))

    def close(self) -> None:
        """The ownership is over: whatever is still unpublished is left to the next owner (the record's outbox)."""
        self._pump.close()

    async def notice(self, kind: EventKind, **fields: object) -> None:
        """Publish a notice (not committed; published once, after everything before it)."""
        if self.enabled:
            await self._pump.put(Queued(None, self._notice(kind, **fields), {}))

    async def released(self, reason: str) -> None:
        """Say ``released``, while still the owner, and wait (at most the NATS timeout) for it and everything before
        it to be stored: its seq is then the last durable event, all of them stored."""
        if not self.enabled:
            return
        await self._pump.put(Queued(None, self._notice("released", reason=reason[:128]), {}))
        await self._pump.drained(self._timeout)

    def _notice(self, kind: EventKind, **fields: object) -> dict[str, Any]:
        event = self._event(kind, **fields)
        event["seq"] = self._seq
        return event

    def _event(self, kind: EventKind, **fields: object) -> dict[str, Any]:
        """A new event in its JSON-model form (ChangeSetEvent v1; ``seq`` still to set). Built as a dict: a
        model per event costs a fifth of the daemon's time per request. The tests check every kind against the
        model."""
        change_set, durable = self._change_set, kind in DURABLE_KINDS
        event = {
            "id": str(RequestId.new()),
            "workspace_id": str(change_set.workspace_id),
            "change_set_id": str(change_set.change_set_id),
            "kind": kind,
            "durable": durable,
            "at": time.time(),
            "epoch": self._epoch,
            **fields,
        }
        if not durable:  # who owns it is said when it is taken and released, not again with every outcome
            event["owner"] = self._owner
        return event


def _on_stored(unconfirmed: dict[int, dict[str, Any]], stats: Stats) -> Callable[[int | None, bool], None]:
    def stored(seq: int | None, published: bool) -> None:
        """An event is stored: ``published`` by this owner now, or found stored (by an earlier owner or attempt)."""
        if published:
            stats.events_published += 1
        if seq is not None:
            unconfirmed.pop(seq, None)

    return stored


def _on_failure(change_set: ChangeSet, stats: Stats) -> Callable[[Exception], None]:
    def failed(err: Exception) -> None:
        stats.event_publish_failures += 1
        log.warning("%s: publishing events failed (sent again, in order): %r", change_set, err)

    return failed


def _seq_of(event: Mapping[str, Any]) -> int | None:
    """The seq of a durable event the last owner left in the record's outbox (None: not one we can read)."""
    try:
        return (
            CHANGE_SET_EVENT.current.model_validate(event, strict=False).seq if event.get("durable") else None
        )
    except ValueError:
        return None


def _trace_of(msg: Msg) -> dict[str, str]:
    """The trace context the request carried, for its event: a follower's span can join the request's trace."""
    headers = msg.headers or {}
    return {name: value for name in TRACE_HEADERS if (value := headers.get(name)) is not None}
