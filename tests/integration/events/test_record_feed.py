"""The record feed against a real nats-server, at the defaults: every write of a change set's record carries its last
durable events (``Rebaser-Events``), and followers read them from the change-sets bucket's stream, headers only.
Every outcome once, in order; resumable from a seq within the window; a since older than the window is a typed gap;
a workspace filter; the window carried on by the next owner; exact when a commit is stored but its answer lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from rebaser_client import EventsLost, RebaserClient, SetLiteral
from rebaser_core.api import EVENTS_HEADER, read_window
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_server.app import ChangeSet
from rebaser_server.record.handle import ChangeSetHandle
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.events import next_durable, record_window


async def test_a_default_deployment_tells_every_applied_request_once_in_order(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        async with client.watch(wk, cs, since=0) as feed:
            sent = [await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=n)]) for n in range(30)]
            last = await client.enqueue_updates_with_reply(wk, cs, [], timeout=20)
            sent.append(last.id)
            events = await next_durable(feed, len(sent))
        assert [e.request_id for e in events] == sent
        assert [e.seq for e in events] == list(range(1, len(sent) + 1))
        assert {e.kind for e in events} == {"applied"}
        assert events[-1].settled and events[-1].queued == 0
        # No message of its own: no events stream, and nothing published to one.
        with pytest.raises(NotFoundError):
            await nc.jetstream().stream_info(settings.subjects.events_stream)
        assert daemon.stats.events_published == 0
        # The record's last write carries the last 16 (events_window), numbered on from the record's counter.
        window = await record_window(nc.jetstream(), settings, wk, cs)
        assert [e.seq for e in window] == list(range(len(sent) - 15, len(sent) + 1))
        record = await daemon.store.read(ChangeSet(wk, cs))
        assert record is not None and record.events == len(sent) and record.outbox == ()


async def test_a_follower_from_now_on_is_told_only_what_comes(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        for n in range(3):
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=n)], timeout=20)
        async with client.watch(wk, cs) as feed:
            reply = await client.enqueue_updates_with_reply(wk, cs, [], timeout=20)
            [event] = await next_durable(feed, 1)
        assert (event.request_id, event.seq) == (reply.id, 4)


async def test_resuming_within_the_window_misses_nothing_and_older_is_a_typed_gap(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, events_window=4)
    async with running_daemon(nc, settings, RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        sent = [await client.enqueue_updates(wk, cs, [SetLiteral(path="/a", value=n)]) for n in range(10)]
        await client.wait_settled(wk, cs, timeout=20)
        async with client.watch(wk, cs, since=7) as feed:
            rest = await next_durable(feed, 3)
        assert [(e.seq, e.request_id) for e in rest] == [(8, sent[7]), (9, sent[8]), (10, sent[9])]
        async with client.watch(wk, cs, since=2) as feed:
            with pytest.raises(EventsLost) as lost:
                await next_durable(feed, 1)
            after = await next_durable(feed, 4)  # iterating on goes on right after the gap
        assert (lost.value.expected, lost.value.got, lost.value.lost) == (3, 7, 4)
        assert [e.request_id for e in after] == sent[6:]


async def test_a_workspace_follower_is_told_its_change_sets_and_no_others(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()):
        wk, other = WorkspacePk.new(), WorkspacePk.new()
        one, two = ChangeSetId.new(), ChangeSetId.new()
        await client.enqueue_updates_with_reply(wk, one, [], timeout=20)  # before: resumed with since
        async with client.watch(wk, since={one: 0}) as feed:
            mine = {
                await client.enqueue_updates(wk, one, []),
                await client.enqueue_updates(wk, two, []),
            }
            await client.enqueue_updates(other, ChangeSetId.new(), [])
            events = await next_durable(feed, 3)
            with pytest.raises(TimeoutError):
                await feed.next(0.5)
        assert {e.workspace_id for e in events} == {wk}
        assert mine <= {e.request_id for e in events}
        assert sorted((str(e.change_set_id), e.seq) for e in events) == sorted(
            [(str(one), 1), (str(one), 2), (str(two), 1)]
        )
        assert feed.resume_points() == {one: 2, two: 1}


async def test_the_next_owner_carries_the_window_on(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, quiescent_period=0.1)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    first: list[object] = []
    async with running_daemon(nc, settings, RecordingApp()):
        for n in range(3):
            first.append(
                (await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=n)])).id
            )
    # Another daemon (the first one stopped, its change sets handed back): its takeover write, and its commits,
    # carry the first owner's events on.
    async with running_daemon(nc, settings, RecordingApp()):
        taken = await client.enqueue_updates_with_reply(wk, cs, [], timeout=20)
        async with client.watch(wk, cs, since=0) as feed:
            events = await next_durable(feed, 4)
    assert [e.request_id for e in events] == [*first, taken.id]
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert events[0].epoch < events[-1].epoch


async def test_a_commit_stored_with_its_answer_lost_is_told_once_and_nothing_after_it_is_told_twice(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every other commit is stored and its answer lost; for every other one of those the read back is unanswered
    too: the owner finds out at its next write (a group, a DVU run, the hand-back mark). Each applied request has
    exactly one event, in order, and the follower is never told an event that a later write takes back."""
    faulty = {"on": True, "n": 0, "unreadable": False}
    write = ChangeSetHandle._write
    read_back = ChangeSetHandle._own_write_landed

    async def lost_answers(self: ChangeSetHandle, value: bytes, headers: dict[str, str] | None) -> int:
        faulty["n"] += 1
        revision = await write(self, value, headers)
        if faulty["on"] and faulty["n"] % 2 == 0:
            faulty["unreadable"] = (
                faulty["n"] % 4 == 0
            )  # every other such write: its first read back fails too
            raise TimeoutError("stored, the answer lost")
        return revision

    async def unanswered_reads(self: ChangeSetHandle, value: bytes) -> bool:
        if faulty["unreadable"]:
            faulty["unreadable"] = False
            raise TimeoutError("the read back unanswered too")
        return await read_back(self, value)

    monkeypatch.setattr(ChangeSetHandle, "_write", lost_answers)
    monkeypatch.setattr(ChangeSetHandle, "_own_write_landed", unanswered_reads)
    # A commit that raises gives the task back: a short ack_wait keeps the redeliveries quick.
    settings = fast_settings(
        subject_prefix,
        events_window=64,
        quiescent_period=0.05,
        retry_backoff=0.01,
        ack_wait=1.0,
        progress_period=0.2,
    )
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        async with client.watch(wk, cs, since=0) as feed:
            replies = []
            for n in range(12):
                replies.append(
                    await client.enqueue_updates_with_reply(
                        wk, cs, [SetLiteral(path="/dvu" if n % 5 == 0 else "/a", value=n)], timeout=30
                    )
                )
            faulty["on"] = False
            last = await client.enqueue_updates_with_reply(wk, cs, [], timeout=30)
            await client.wait_settled(wk, cs, timeout=30)
            window = await record_window(nc.jetstream(), settings, wk, cs)
            told = await next_durable(feed, len(window))
        record = await daemon.store.read(ChangeSet(wk, cs))
        assert record is not None
    applied = record.state["applied"]
    assert all(r.ok for r in replies) and last.ok
    outcomes = [e for e in window if e.request_id is not None]
    assert [str(e.request_id) for e in outcomes] == [str(rid) for rid in applied], (
        "an applied request lost or told twice"
    )
    assert [e.seq for e in window] == list(range(1, len(window) + 1))
    assert [(e.seq, e.id) for e in told] == [(e.seq, e.id) for e in window], (
        "the follower was told another story"
    )
    assert any(e.kind == "dvu_finished" for e in window)
    assert faulty["n"] > 12


async def test_a_window_header_that_does_not_read_is_skipped_and_counted(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, tmp_path: Path
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        await client.enqueue_updates_with_reply(wk, cs, [], timeout=20)
        async with client.watch(wk, since={}) as feed:
            [first] = await next_durable(feed, 1)
            # A write to another change set's key of the same workspace, with a header that is not a window.
            junk = ChangeSetId.new()
            await nc.jetstream().publish(
                settings.subjects.record_subject(wk, junk),
                b"x",
                headers={EVENTS_HEADER: '{"v":2,"new":1,"events":[1]}'},
            )
            second = await client.enqueue_updates_with_reply(wk, cs, [], timeout=20)
            [event] = await next_durable(feed, 1)
        assert first.seq == 1 and (event.seq, event.request_id) == (2, second.id)
        assert feed.malformed == 1
    with pytest.raises(Exception, match="not valid"):
        read_window('{"v":2,"new":1,"events":[1]}', wk, cs)


async def test_an_upgrade_daemons_first_then_followers_loses_no_event(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """From a release that published the events stream only (``events`` on, no window), to the record feed: the
    daemons first (they carry the window and keep publishing the stream), then the followers (the record feed, from
    where the stream left them), then the stream off. No follower misses an event or is told one twice."""
    wk, cs = WorkspacePk.new(), ChangeSetId.new()

    async def send(count: int) -> list[object]:
        return [
            (await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=n)], timeout=20)).id
            for n in range(count)
        ]

    earlier = fast_settings(subject_prefix, events=True, events_window=0)  # as the earlier release wrote
    async with running_daemon(nc, earlier, RecordingApp()):
        old_follower = await client.watch(wk, cs, since=0, feed="stream").start()
        before = await send(3)
        assert await record_window(nc.jetstream(), earlier, wk, cs) == []  # no window written yet
    try:
        # 1. The daemons: the record feed and the stream both.
        both = fast_settings(subject_prefix, events=True)
        async with running_daemon(nc, both, RecordingApp()):
            during = await send(3)
            told_old = await next_durable(old_follower, 6)
            # 2. The followers: from where the stream left them, on the record feed.
            new_follower = await client.watch(wk, cs, since=old_follower.resume_points()[cs]).start()
            later = await send(2)
            told_old += await next_durable(old_follower, 2)
            told_new = await next_durable(new_follower, 2)
        # 3. The stream off.
        async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon:
            last = await send(2)
            told_new += await next_durable(new_follower, 2)
            assert daemon.stats.events_published == 0
    finally:
        await old_follower.close()
    await new_follower.close()
    assert [e.request_id for e in told_old] == [*before, *during, *later]
    assert [e.seq for e in told_old] == list(range(1, 9))
    assert [e.request_id for e in told_new] == [*later, *last]
    assert [e.seq for e in told_new] == list(range(7, 11))
    # The same events by both feeds, to the event's own id.
    assert [e.id for e in told_old[-2:]] == [e.id for e in told_new[:2]]
