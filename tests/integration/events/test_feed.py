"""The change-set event feed against a real nats-server: every outcome once, in order, after its commit; resumable
from a seq; a gap told, with its size; a workspace filter; junk on the events subjects skipped; a crash between a
commit and its events' publication loses none of them."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from nats.aio.client import Client as NatsClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rebaser_client import ChangeSetEvent, EventsLost, RebaserClient, SetLiteral
from rebaser_core.api import CHANGE_SET_EVENT, MAX_EVENT_BYTES
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.record.store import TaskDelivery
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.events import check_feed, next_durable, stored_events


async def test_a_follower_sees_every_applied_request_once_in_order(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix, events=True), RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        async with client.watch(wk, cs, since=0, feed="stream") as feed:
            sent = [await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=n)]) for n in range(30)]
            last = await client.enqueue_updates_with_reply(wk, cs, [], timeout=20)
            sent.append(last.id)
            events = await next_durable(feed, len(sent))
        assert [e.request_id for e in events] == sent
        assert [e.seq for e in events] == list(range(1, len(sent) + 1))
        assert all(e.queued is not None for e in events)
        assert events[-1].queued == 0 and events[-1].settled
        assert {e.kind for e in events} == {"applied"}
        assert all(e.status == "success" and e.updates_performed == 1 for e in events[:-1])
        record = await daemon.store.read(ChangeSet(wk, cs))
        assert record is not None and record.events == len(sent)
        assert daemon.stats.events_published >= len(sent)
        assert daemon.stats.event_publish_failures == 0


async def test_notices_say_taken_and_released_and_the_last_event_settled(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, events=True, quiescent_period=0.2)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        async with client.watch(wk, cs, feed="stream") as feed:
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/dvu", value=1)], timeout=20)
            events: list[ChangeSetEvent] = []
            while not events or events[-1].kind != "released":
                events.append(await feed.next(20))
        assert all(e.owner == daemon.owner for e in events if not e.durable)
        assert all(e.epoch >= 1 for e in events)
        kinds = [e.kind for e in events]
        # Taken first; the request (a DVU due: not settled); its DVU (started, then committed: settled); released.
        assert kinds == ["taken", "applied", "dvu_started", "dvu_finished", "released"]
        applied, finished = events[1], events[3]
        assert not applied.settled and finished.settled
        assert (applied.seq, finished.seq) == (1, 2)
        assert finished.duration_s is not None and finished.duration_s >= 0
        # A notice carries the seq of the durable event before it.
        assert [e.seq for e in events if not e.durable] == [0, 1, 2]


async def test_a_dead_lettered_request_is_told_with_its_reason_class(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, events=True)
    async with running_daemon(nc, settings, RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        async with client.watch(wk, cs, since=0, feed="stream") as feed:
            poison = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/poison", value=1)], timeout=20
            )
            # Bytes with no headers on the change set's request subject: refused before any app sees them.
            await nc.jetstream().publish(settings.subjects.requests(wk, cs), b"\xff junk")
            ok = await client.enqueue_updates_with_reply(wk, cs, [], timeout=20)
            events = await next_durable(feed, 3)
        assert not poison.ok and ok.ok
        assert [(e.kind, e.reason) for e in events] == [
            ("dead_lettered", "UnprocessableError"),
            ("dead_lettered", "MissingHeader"),
            ("applied", None),
        ]
        assert events[0].request_id == poison.id and events[0].status == "error"
        assert events[2].settled


async def test_a_follower_that_stops_and_resumes_from_since_misses_nothing(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix, events=True), RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        first = [await client.enqueue_updates(wk, cs, [SetLiteral(path="/a", value=n)]) for n in range(10)]
        async with client.watch(wk, cs, since=0, feed="stream") as feed:
            seen = await next_durable(feed, 5)
        assert [e.request_id for e in seen] == first[:5]
        more = [await client.enqueue_updates(wk, cs, [SetLiteral(path="/b", value=n)]) for n in range(5)]
        async with client.watch(wk, cs, since=seen[-1].seq, feed="stream") as feed:
            rest = await next_durable(feed, 10)
        assert [e.request_id for e in rest] == first[5:] + more
        assert [e.seq for e in rest] == list(range(6, 16))


async def test_a_since_older_than_the_retention_is_a_typed_gap(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # The stream keeps 10 events per change set: the first requests' events are gone.
    settings = fast_settings(subject_prefix, events=True, events_max_per_change_set=10)
    async with running_daemon(nc, settings, RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        sent = [await client.enqueue_updates(wk, cs, [SetLiteral(path="/a", value=n)]) for n in range(20)]
        await client.wait_settled(wk, cs, timeout=20)
        async with client.watch(wk, cs, since=2, feed="stream") as feed:
            with pytest.raises(EventsLost) as lost:
                await next_durable(feed, 1)
            # Iterating on resumes right after the gap.
            after = await next_durable(feed, 1)
        gap = lost.value
        assert gap.expected == 3 and gap.got > 3 and gap.lost == gap.got - 3
        assert after[0].seq == gap.got
        assert after[0].request_id == sent[gap.got - 1]


async def test_a_workspace_follower_sees_only_its_workspace(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix, events=True), RecordingApp()):
        wk, other = WorkspacePk.new(), WorkspacePk.new()
        one, two = ChangeSetId.new(), ChangeSetId.new()
        async with client.watch(wk, feed="stream") as feed:
            mine = {
                await client.enqueue_updates(wk, cs, [SetLiteral(path="/a", value=1)]) for cs in (one, two)
            }
            await client.enqueue_updates_with_reply(other, one, [SetLiteral(path="/a", value=1)], timeout=20)
            seen = await next_durable(feed, 2)
            assert {e.request_id for e in seen} == mine
            assert {e.change_set_id for e in seen} == {one, two}
            # Nothing of the other workspace comes, though its request was answered before ours were all seen.
            await client.enqueue_updates_with_reply(wk, one, [], timeout=20)
            (last,) = await next_durable(feed, 1)
            assert last.workspace_id == wk and last.change_set_id == one


async def test_junk_on_the_events_subject_is_skipped_not_fatal(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, events=True)
    async with running_daemon(nc, settings, RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        subject = settings.subjects.events(wk, cs)
        js = nc.jetstream()
        async with client.watch(wk, cs, feed="stream") as feed:
            junk = [
                (b"\xff\x00garbage", None),
                (b"{}", {"X-MESSAGE-TYPE": "ChangeSetEvent", "X-MESSAGE-VERSION": "1"}),
                (b"\x00" * (MAX_EVENT_BYTES + 1), {"X-MESSAGE-TYPE": "ChangeSetEvent"}),
                (b"", {"X-MESSAGE-TYPE": "ChangeSetEvent", "X-MESSAGE-VERSION": "99"}),
            ]
            for body, headers in junk:
                await js.publish(subject, body, headers=headers)
            # An event of another change set, on this one's subject.
            forged = ChangeSetEvent(
                id=RequestId.new(),
                workspace_id=wk,
                change_set_id=ChangeSetId.new(),
                kind="applied",
                seq=1,
                durable=True,
                at=0.0,
            )
            headers, body = CHANGE_SET_EVENT.encode(forged)
            await js.publish(subject, body, headers=headers)
            rid = await client.enqueue_updates(wk, cs, [SetLiteral(path="/a", value=1)])
            (event,) = await next_durable(feed, 1)
        assert event.request_id == rid
        assert feed.malformed == len(junk) + 1


async def test_events_left_unpublished_by_a_dead_owner_are_published_by_the_next(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """The owner died after committing a group and before publishing its events: they are in the record's outbox,
    and the next owner publishes them (under their Nats-Msg-Id) before anything of its own."""
    settings = fast_settings(subject_prefix, events=True)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        first = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=1)], timeout=20)
        change_set = ChangeSet(wk, cs)
        await wait_for(lambda: not daemon.owned, timeout=20, message="released")
        record = await daemon.store.read(change_set)
        assert record is not None and record.events == 1
        # What the dead owner's last commit would hold: two more durable events, committed, never published.
        lost = [
            {
                "id": str(RequestId.new()),
                "workspace_id": str(wk),
                "change_set_id": str(cs),
                "kind": "applied",
                "seq": seq,
                "durable": True,
                "at": 1.0,
                "request_id": str(RequestId.new()),
                "status": "success",
                "updates_performed": 1,
            }
            for seq in (2, 3)
        ]
        # Taken by an owner that then died (a later delivery of the same task message: not stale).
        delivery = TaskDelivery(record.task_seq, record.task_delivery + 1)
        handle = (await daemon.store.acquire(change_set, "dead", record.state, delivery)).handle
        await handle.commit(replace(handle.record, events=3, outbox=tuple(lost)))
        async with client.watch(wk, cs, since=1, feed="stream") as feed:
            nxt = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/a", value=2)], timeout=20
            )
            events = await next_durable(feed, 3)
        assert [e.seq for e in events] == [2, 3, 4]
        assert [str(e.request_id) for e in events[:2]] == [e["request_id"] for e in lost]
        assert events[2].request_id == nxt.id
        assert first.ok and nxt.ok
        # Each stored once (or repeated as the same event), no hole, no other event under their seqs.
        applied = [e["request_id"] for e in lost]
        stored = await stored_events(nc.jetstream(), settings, wk, cs)
        assert check_feed(stored, [str(first.id), *applied, str(nxt.id)]) == []
        assert sorted({e.seq for e in stored if e.durable}) == [1, 2, 3, 4]


async def test_an_event_carries_its_requests_trace_context(nc: NatsClient, subject_prefix: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = fast_settings(subject_prefix, events=True)
    try:
        async with running_daemon(nc, settings, RecordingApp()):
            wk, cs = WorkspacePk.new(), ChangeSetId.new()
            async with RebaserClient(nc, prefix=subject_prefix, tracer_provider=provider) as client:
                with provider.get_tracer("test").start_as_current_span("caller") as caller:
                    reply = await client.enqueue_updates_with_reply(wk, cs, [], timeout=20)
            assert reply.ok
            sub = await nc.jetstream().subscribe(
                settings.subjects.events(wk, cs),
                stream=settings.subjects.events_stream,
                ordered_consumer=True,
            )
            try:
                while True:
                    msg = await sub.next_msg(timeout=10)
                    event = CHANGE_SET_EVENT.decode(msg.headers, msg.data)
                    if event.durable:
                        break
            finally:
                await sub.unsubscribe()
        traceparent = (msg.headers or {}).get("traceparent", "")
        assert traceparent.split("-")[1] == f"{caller.get_span_context().trace_id:032x}"
    finally:
        provider.shutdown()


async def test_the_next_owner_does_not_store_again_what_the_last_one_published(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """The record keeps its last group's events (the outbox) after they are stored (and, until the new owner has
    looked, the ones it took over); the next owner looks in the stream from where the record says the events were
    stored and publishes only what is missing, so nothing is stored twice after the duplicate window."""
    window = 0.3
    settings = fast_settings(subject_prefix, events=True, duplicate_window=window, quiescent_period=0.05)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        change_set = ChangeSet(wk, cs)
        sent = []
        for n in range(3):
            sent.append((await client.enqueue_updates_with_reply(wk, cs, [], timeout=20)).id)
            await wait_for(lambda: not daemon.owned, timeout=20, message=f"released after request {n}")
            record = await daemon.store.read(change_set)
            assert record is not None and [e["seq"] for e in record.outbox][-1:] == [n + 1]
            await asyncio.sleep(window * 2)  # the stream's duplicate window must be over: that is the point
        stored = await stored_events(nc.jetstream(), settings, wk, cs)
    durable = [e for e in stored if e.durable]
    assert [e.seq for e in durable] == [1, 2, 3]
    assert [e.request_id for e in durable] == sent
    assert [e.kind for e in stored if not e.durable].count("taken") == 3


async def test_a_follower_that_falls_behind_a_replay_loses_nothing(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    count = 1500
    settings = fast_settings(subject_prefix, events=True, events_max_per_change_set=2 * count)  # all kept
    async with running_daemon(nc, settings, RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        sent = [await client.enqueue_updates(wk, cs, [SetLiteral(path="/a", value=n)]) for n in range(count)]
        await client.wait_settled(wk, cs, timeout=60)
        async with client.watch(wk, cs, since=0, feed="stream") as feed:
            await feed.start()
            sub = feed._sub  # the follower reads nothing until the replay has piled up unread

            # The server pushes until its flow control waits for the follower (about 1,000 messages here).
            await wait_for(lambda: sub.pending_msgs >= 900, timeout=30, message="the replay piled up, unread")
            events = await next_durable(feed, count)
        assert [e.request_id for e in events] == sent
