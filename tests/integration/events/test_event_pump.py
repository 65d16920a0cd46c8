"""The ordered publisher of one change set's events (rebaser_server.changeset.event_pump) against a real
nats-server: batches stored in order; what an earlier owner stored is not stored again; a message someone else
publishes on the subject meanwhile is stepped over; a stream without atomic batches gets one event at a time."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_core.api import CHANGE_SET_EVENT
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.requester import Requester
from rebaser_core.nats.streams import events_stream_config
from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet
from rebaser_server.changeset import event_pump
from rebaser_server.changeset.context import Stats
from rebaser_server.changeset.event_lookup import Queued
from rebaser_server.changeset.event_pump import EventPump
from rebaser_server.changeset.events import ChangeSetFeed
from rebaser_server.record.model import ChangeSetRecord


def _event(wk: WorkspacePk, cs: ChangeSetId, seq: int) -> dict[str, Any]:
    return {
        "id": str(RequestId.new()),
        "workspace_id": str(wk),
        "change_set_id": str(cs),
        "kind": "applied",
        "seq": seq,
        "durable": True,
        "at": 1.0,
    }


async def _stored_seqs(nc: NatsClient, stream: str, subject: str) -> list[int]:
    js = nc.jetstream()
    info = await js.stream_info(stream)
    seqs = []
    for n in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await js.get_msg(stream, n)
        if msg.subject == subject:
            seqs.append(CHANGE_SET_EVENT.decode(msg.headers, msg.data or b"").seq)
    return seqs


def _next_owner(
    requester: Requester, stream: str, subject: str, wk: WorkspacePk, cs: ChangeSetId
) -> EventPump:
    """The event pump of another ownership of the same change set (the callbacks ignored)."""
    return EventPump(
        requester,
        stream=stream,
        subject=subject,
        ids=(wk, cs),
        timeout=2.0,
        on_stored=lambda seq, published: None,
        on_failure=lambda err: None,
    )


@pytest.fixture
async def pump_on(nc: NatsClient, subject_prefix: str) -> Any:
    async def make(*, atomic: bool = True) -> tuple[EventPump, str, str, WorkspacePk, ChangeSetId, list[str]]:
        settings = Settings(prefix=subject_prefix)
        config = events_stream_config(settings)
        config.allow_atomic = atomic
        await nc.jetstream().add_stream(config)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        subject = settings.subjects.events(wk, cs)
        requester = Requester(nc)
        failures: list[str] = []
        pump = EventPump(
            requester,
            stream=settings.subjects.events_stream,
            subject=subject,
            ids=(wk, cs),
            timeout=2.0,
            on_stored=lambda seq, published: None,
            on_failure=lambda err: failures.append(repr(err)),
        )
        made.append((pump, requester))
        return pump, settings.subjects.events_stream, subject, wk, cs, failures

    made: list[tuple[EventPump, Requester]] = []
    yield make
    for pump, requester in made:
        pump.close()
        await requester.close()


async def test_queued_events_are_stored_in_order_in_batches(nc: NatsClient, pump_on: Any) -> None:
    pump, stream, subject, wk, cs, failures = await pump_on()
    pump.start_after(0)
    for seq in range(1, 301):
        await pump.put(Queued(seq, _event(wk, cs, seq), {}))
    assert await pump.drained(20)
    assert await _stored_seqs(nc, stream, subject) == list(range(1, 301))
    assert failures == []


@pytest.mark.parametrize("record_knew", ["nothing", "the first"])
async def test_what_an_earlier_owner_stored_is_not_stored_again(
    nc: NatsClient, pump_on: Any, record_knew: str
) -> None:
    first, stream, subject, wk, cs, _ = await pump_on()
    events = [_event(wk, cs, seq) for seq in range(1, 6)]
    first.start_after(0)
    await first.put(Queued(1, events[0], {}))
    assert await first.drained(10)
    known = first.last  # the record of the commit after event 1 says it is stored at this stream sequence
    assert known is not None
    for seq, event in enumerate(events[1:3], 2):
        await first.put(Queued(seq, event, {}))
    assert await first.drained(10)
    # The next owner took over 1-5 (its record's outbox) and finds 1-3 stored: from the sequence its record names
    # (read on from there), or with none (the subject's last message tells).
    requester = Requester(nc)
    second = _next_owner(requester, stream, subject, wk, cs)
    second.start_after(0 if record_knew == "nothing" else known)
    for seq, event in enumerate(events, 1):
        await second.put(Queued(seq, event, {}))
    try:
        assert await second.drained(10)
    finally:
        await requester.close()
    assert await _stored_seqs(nc, stream, subject) == [1, 2, 3, 4, 5]


async def test_a_message_published_meanwhile_is_stepped_over(nc: NatsClient, pump_on: Any) -> None:
    pump, stream, subject, wk, cs, failures = await pump_on()
    pump.start_after(0)
    await pump.put(Queued(1, _event(wk, cs, 1), {}))
    assert await pump.drained(10)
    # An operator's notice on the same subject: the publisher's next batch expects what it knew as the last.
    notice = {**_event(wk, cs, 1), "kind": "paused", "durable": False, "owner": "operator"}
    headers, body = CHANGE_SET_EVENT.encode(CHANGE_SET_EVENT.current.model_validate(notice))
    await nc.jetstream().publish(subject, body, headers=headers)
    for seq in (2, 3):
        await pump.put(Queued(seq, _event(wk, cs, seq), {}))
    assert await pump.drained(10)
    assert await _stored_seqs(nc, stream, subject) == [1, 1, 2, 3]  # the notice carries the seq before it
    assert failures == []  # a refusal for the wrong last sequence is no failure: nothing was stored


async def test_a_stream_without_atomic_batches_gets_one_event_at_a_time(nc: NatsClient, pump_on: Any) -> None:
    pump, stream, subject, wk, cs, _ = await pump_on(atomic=False)
    pump.start_after(0)
    for seq in range(1, 21):
        await pump.put(Queued(seq, _event(wk, cs, seq), {}))
    assert await pump.drained(20)
    assert await _stored_seqs(nc, stream, subject) == list(range(1, 21))


async def test_an_event_found_stored_leaves_the_outbox(
    nc: NatsClient, pump_on: Any, subject_prefix: str
) -> None:
    """The new owner finds that the last owner stored an event of the outbox it took over: the next record's outbox
    no longer carries it (else every later owner would look for it from past where it is, and store it again)."""
    pump, stream, subject, wk, cs, _ = await pump_on()
    stored = _event(wk, cs, 1)
    pump.start_after(0)
    await pump.put(Queued(1, stored, {}))  # the last owner's publication
    assert await pump.drained(10)
    requester = Requester(nc)
    feed = ChangeSetFeed(
        ChangeSet(wk, cs),
        requester=requester,
        subjects=Settings(prefix=subject_prefix).subjects,
        owner="next",
        stats=Stats(),
        timeout=2.0,
        enabled=True,
    )
    try:
        record = ChangeSetRecord(epoch=2, owner="next", state={}, events=1, outbox=(stored,))
        feed.taken(record)
        assert await feed._pump.drained(10)
        assert feed.stage(record, [], [], settled=False).outbox == ()
    finally:
        feed.close()
        await requester.close()
    assert await _stored_seqs(nc, stream, subject) == [1, 1]  # the event, then the taken notice after it


async def test_a_batch_cut_short_on_its_way_is_stored_whole_later_in_order(
    nc: NatsClient, pump_on: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One message of the first atomic batch never reaches the server: the server refuses the batch as incomplete
    (nothing of it stored), and the events go again, one at a time, in order, each once."""
    pump, stream, subject, wk, cs, failures = await pump_on()
    original = NatsClient.publish
    dropped: list[str] = []

    async def publish(self: NatsClient, subj: str, payload: bytes = b"", reply: str = "", **kw: Any) -> None:
        headers = kw.get("headers") or {}
        if subj == subject and headers.get("Nats-Batch-Sequence") == "2" and not dropped:
            dropped.append(headers["Nats-Batch-Id"])
            return
        await original(self, subj, payload, reply=reply, **kw)

    monkeypatch.setattr(NatsClient, "publish", publish)
    pump.start_after(0)
    await pump.put(*(Queued(seq, _event(wk, cs, seq), {}) for seq in range(1, 81)))
    assert await pump.drained(30)
    assert dropped and failures == []  # refused for the limit: nothing stored, no failure
    assert await _stored_seqs(nc, stream, subject) == list(range(1, 81))


async def test_a_stale_owners_late_notice_does_not_hide_a_stored_event(nc: NatsClient, pump_on: Any) -> None:
    # Seen in the partitions battery: owner 2 stored event 51, then owner 1, cut off since event 19 and back, stored
    # its late "released" notice (seq 19) after it. Owner 3 took over 51 from the record's outbox (owner 2 never
    # trimmed it), found the stale notice as the subject's last message, took it to mean "stored up to 19", and
    # stored 51 again.
    owner2, stream, subject, wk, cs, _ = await pump_on()
    owner2.start_after(0)
    events = {seq: _event(wk, cs, seq) for seq in (50, 51)}
    for seq, event in events.items():
        await owner2.put(Queued(seq, event, {}))
    assert await owner2.drained(10)
    events_at = owner2.last  # where the record's last commit (after event 50) said the events were stored
    assert events_at is not None
    events_at -= 1
    released = {
        "id": str(RequestId.new()),
        "workspace_id": str(wk),
        "change_set_id": str(cs),
        "kind": "released",
        "seq": 19,
        "durable": False,
        "epoch": 1,
        "owner": "vm:1:owner-one",
        "at": 1.0,
    }
    owner1_requester = Requester(nc)
    owner1 = _next_owner(owner1_requester, stream, subject, wk, cs)
    owner1.start_after(0)
    await owner1.put(Queued(None, released, {}))
    assert await owner1.drained(10)
    owner1.close()
    await owner1_requester.close()
    requester = Requester(nc)
    owner3 = _next_owner(requester, stream, subject, wk, cs)
    owner3.start_after(events_at)
    owner3.enqueue(Queued(51, events[51], {}))
    try:
        assert await owner3.drained(10)
    finally:
        await requester.close()
    assert await _stored_seqs(nc, stream, subject) == [50, 51, 19]


async def test_notices_waiting_while_the_stream_refuses_are_bounded_the_newest_kept(
    nc: NatsClient, pump_on: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(event_pump, "MAX_QUEUED_NOTICES", 4)
    pump, stream, subject, wk, cs, _ = await pump_on()
    await nc.jetstream().delete_stream(stream)  # every publish fails until it is back
    pump.start_after(0)
    await pump.put(Queued(1, _event(wk, cs, 1), {}))
    for n in range(100):
        notice = {**_event(wk, cs, 1), "kind": "dvu_started", "durable": False, "at": float(n)}
        await pump.put(Queued(None, notice, {}))
    waiting = [q for q in pump._queue[pump._in_flight :] if q.seq is None]
    assert len(waiting) == 4 and [q.event["at"] for q in waiting] == [96.0, 97.0, 98.0, 99.0]
    assert pump.notices_dropped == 96
    await nc.jetstream().add_stream(events_stream_config(Settings(prefix=subject.split(".")[0])))
    assert await pump.drained(20)
    js = nc.jetstream()
    info = await js.stream_info(stream)
    stored = [await js.get_msg(stream, n) for n in range(info.state.first_seq, info.state.last_seq + 1)]
    kinds = [CHANGE_SET_EVENT.decode(m.headers, m.data or b"").kind for m in stored if m.subject == subject]
    assert (
        kinds.count("applied") == 1 and 4 <= kinds.count("dvu_started") <= 5
    )  # (one may have been in flight)
