"""The event feed of one owned change set (rebaser_core.api.events): decided with the commit, published after it.

A commit group's durable events are numbered from the record's ``events`` counter and written into the record that
is committed (``outbox``), *then* published: an owner fenced at the commit publishes nothing, and an owner that
dies between the commit and the publication leaves them in the record for the next owner, who publishes them again
(:meth:`ChangeSetFeed.taken`). Publication never waits on the request path: each event's acknowledgement comes back
to a callback. One that fails is published again before the next ones; while unacknowledged it stays in the
outbox of every commit (at most :data:`OUTBOX_MAX`; beyond that the oldest are given up, and a follower sees the
gap in ``seq``).

Notices (taken, released, DVU started or failed) are not committed: published once, in order with the
rest, on this owner's word.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import nats.errors
from nats.aio.msg import Msg

from rebaser_core import headers as h
from rebaser_core.api import (
    CHANGE_SET_EVENT,
    DURABLE_KINDS,
    ConflictsStatus,
    ContentType,
    EventKind,
    SuccessStatus,
    event_msg_id,
    reason_class,
)
from rebaser_core.api.codec import encode_body
from rebaser_core.errors import ProtocolError
from rebaser_core.ids import RequestId
from rebaser_core.nats.requester import Answer, Requester, last_message_direct
from rebaser_core.nats.tasks import check_pub_ack
from rebaser_core.subjects import Subjects
from rebaser_core.tracing import TRACE_HEADERS
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.context import Stats
from rebaser_server.changeset.decisions import Decision, Kind
from rebaser_server.record.model import ChangeSetRecord

__all__ = ["OUTBOX_MAX", "ChangeSetFeed"]

log = logging.getLogger(__name__)

# Unacknowledged durable events carried in the record: a NATS outage longer than a few groups gives up the oldest
# (the record must stay small: it is written on every commit).
OUTBOX_MAX = 256

_STATUS_KIND: dict[str, EventKind] = {
    "success": "applied",
    "conflicts": "conflicts",
    "refused": "refused",
    "error": "error_reply",
}


class ChangeSetFeed:
    """What one owned change set tells its followers. ``enabled`` False: nothing is staged or published."""

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
    ) -> None:
        self._change_set = change_set
        self._requester = requester
        self._subject = subjects.events(change_set.workspace_id, change_set.change_set_id)
        self._owner = owner
        self._stats = stats
        self._timeout = timeout
        self.enabled = enabled
        self._epoch = 0
        self._seq = 0  # the last durable event's seq (committed)
        # seq -> durable events (their JSON-model form) published, or to publish, and not yet acknowledged; and the
        # ones whose publication failed, published again before anything newer.
        self._unconfirmed: dict[int, dict[str, Any]] = {}
        self._failed: set[int] = set()
        self._staged: list[tuple[int, dict[str, Any], dict[str, str]]] = []
        self._stream = subjects.events_stream
        self._taking: asyncio.Future[None] | None = None  # the take's publications (taken)
        self._confirmed = asyncio.Event()  # set when no durable event awaits its acknowledgement

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
            return record
        events = [
            event
            for decision, waiting in zip(decisions, queued, strict=True)
            if (event := self._outcome(decision, waiting)) is not None
        ]
        return self._stage(record, events, settled)

    def stage_dvu(self, record: ChangeSetRecord, duration: float, *, settled: bool) -> ChangeSetRecord:
        """``record`` (a DVU run's, about to be committed) with its ``dvu_finished`` event."""
        if not self.enabled:
            return record
        return self._stage(
            record, [(self._event("dvu_finished", duration_s=round(duration, 6)), {})], settled
        )

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
        if not self._staged and not self._unconfirmed:
            return record if not record.outbox else replace(record, outbox=())
        outbox = [*self._unconfirmed.values(), *(event for _, event, _ in self._staged)][-OUTBOX_MAX:]
        return replace(record, events=seq, outbox=tuple(outbox))

    async def committed(self) -> None:
        """The record staged last is committed: publish what failed before, then its events."""
        if not self.enabled:
            return
        staged, self._staged = self._staged, []
        await self._taken()
        await self._republish_failed()
        for seq, event, trace in staged:
            self._unconfirmed[seq] = event
            self._seq = seq
            await self._publish(seq, event, trace)
        while len(self._unconfirmed) > OUTBOX_MAX:  # given up: no longer in any outbox
            dropped = next(iter(self._unconfirmed))
            del self._unconfirmed[dropped]
            self._failed.discard(dropped)

    def dropped(self) -> None:
        """The record staged last was not committed (fenced, failed): its events never happened."""
        self._staged = []

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
        """The change set is acquired with ``record``. In the background (off the cold path; anything this owner
        publishes waits for it): publish again what the last owner left in the outbox and the stream does not hold
        yet, then say ``taken``."""
        self._epoch, self._seq = record.epoch, record.events
        if self.enabled:
            self._taking = asyncio.ensure_future(self._take(record.outbox))

    async def _take(self, outbox: Iterable[Mapping[str, Any]]) -> None:
        left = sorted(((seq, dict(e)) for e in outbox if (seq := _seq_of(e)) is not None), key=lambda x: x[0])
        if left:
            # The last owner's last events are usually stored: published again after the stream's duplicate window
            # they would be stored twice. A ``released`` notice stored last says that every durable event up to its
            # seq was acknowledged (:meth:`released`); after anything else (a crash) all are published again, and
            # the window or the followers' check of seq drops what was stored already.
            try:
                last = await last_message_direct(
                    self._requester, self._stream, self._subject, timeout=self._timeout
                )
                stored = _released_seq(last)
            except (nats.errors.Error, TimeoutError, ValueError) as err:
                log.warning(
                    "%s: reading the last event failed, publishing the outbox again: %r",
                    self._change_set,
                    err,
                )
                stored = 0
            for seq, event in left:
                if seq > stored:
                    self._unconfirmed[seq] = event
                    await self._publish(seq, event, {})
        await self._publish(None, self._notice("taken"), {})

    def close(self) -> None:
        """The ownership is over: whatever of the take is still unpublished is left to the next owner."""
        taking, self._taking = self._taking, None
        if taking is not None:
            taking.cancel()

    async def _taken(self) -> None:
        """Wait for the take's own publications (they come before anything else this owner says)."""
        taking, self._taking = self._taking, None
        if taking is not None:
            try:
                await taking
            except Exception as err:  # published as far as it got: a follower sees the gap, if any
                log.warning("%s: publishing the last owner's events failed: %r", self._change_set, err)

    async def notice(self, kind: EventKind, **fields: object) -> None:
        """Publish a notice (not committed; published once)."""
        if not self.enabled:
            return
        await self._taken()
        await self._publish(None, self._notice(kind, **fields), {})

    async def released(self, reason: str) -> None:
        """Say ``released``, while still the owner, once every durable event is stored (what failed is published
        again first; waiting at most the NATS timeout). Its seq is the last durable event up to which all are
        acknowledged, so the next owner publishes again only what may be missing."""
        if not self.enabled:
            return
        await self._taken()
        await self._republish_failed()
        if self._unconfirmed:
            self._confirmed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._timeout):
                    await self._confirmed.wait()
        event = self._notice("released", reason=reason[:128])
        if self._unconfirmed:
            event["seq"] = min(self._unconfirmed) - 1
        await self._publish(None, event, {})

    async def _republish_failed(self) -> None:
        for seq in sorted(self._failed):
            await self._publish(seq, self._unconfirmed[seq], {})
        self._failed.clear()

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

    # -- publication ----------------------------------------------------------------------------------
    async def _publish(self, seq: int | None, event: dict[str, Any], trace: Mapping[str, str]) -> None:
        headers = {
            h.CONTENT_TYPE: ContentType.CBOR.value,
            h.MESSAGE_TYPE: CHANGE_SET_EVENT.name,
            h.MESSAGE_VERSION: "1",
            **trace,
        }
        if seq is not None:
            ws, cs = self._change_set.workspace_id, self._change_set.change_set_id
            headers[h.NATS_MSG_ID] = event_msg_id(ws, cs, seq)
        try:
            await self._requester.send(
                self._subject,
                encode_body(event, ContentType.CBOR),
                timeout=self._timeout,
                headers=headers,
                on_answer=lambda answer: self._answered(seq, answer),
            )
        except (nats.errors.Error, OSError) as err:
            self._answered(seq, err)

    def _answered(self, seq: int | None, answer: Answer) -> None:
        error: Exception | None = answer if isinstance(answer, Exception) else None
        if error is None:
            assert isinstance(answer, Msg)
            try:
                check_pub_ack(answer.data, self._subject)
            except Exception as err:
                error = err
        if error is None:
            self._stats.events_published += 1
            if seq is not None:
                self._unconfirmed.pop(seq, None)
                if not self._unconfirmed:
                    self._confirmed.set()
            return
        self._stats.event_publish_failures += 1
        if seq is not None and seq in self._unconfirmed:
            self._failed.add(seq)  # published again before the next events
        log.warning("%s: publishing an event failed: %r", self._change_set, error)


def _seq_of(event: Mapping[str, Any]) -> int | None:
    """The seq of a durable event the last owner left in the record's outbox (None: not one we can read)."""
    try:
        return (
            CHANGE_SET_EVENT.current.model_validate(event, strict=False).seq if event.get("durable") else None
        )
    except ValueError:
        return None


def _released_seq(msg: Msg | None) -> int:
    """The seq of a ``released`` notice (every durable event up to it is stored); 0 for anything else."""
    if msg is None:
        return 0
    try:
        event = CHANGE_SET_EVENT.decode(msg.headers, msg.data)
    except ProtocolError:
        return 0
    return event.seq if event.kind == "released" else 0


def _trace_of(msg: Msg) -> dict[str, str]:
    """The trace context the request carried, for its event: a follower's span can join the request's trace."""
    headers = msg.headers or {}
    return {name: value for name in TRACE_HEADERS if (value := headers.get(name)) is not None}
