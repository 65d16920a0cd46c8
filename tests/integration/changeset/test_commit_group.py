"""A commit group carried out against a real nats-server (``rebaser_server/changeset/group.py`` and
``postprocess.py``): dead letters before the commit, the commit before the replies, the removal of the processed
requests after them; a group that cannot commit shows nothing; a retry is on record before its task ends.

The group is driven directly (decisions from the real handler, no daemon), and once end to end through a daemon.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from rebaser_core import headers as h
from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    ENQUEUE_UPDATES_RESPONSE,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    InlineUpdates,
    SetLiteral,
)
from rebaser_core.errors import FencedError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.requester import Requester
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.nats.tasks import publish_task
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.app import AppState, ChangeSet, CommitHooks
from rebaser_server.changeset.context import Placement, Report, Stats
from rebaser_server.changeset.decisions import Decision, Kind
from rebaser_server.changeset.events import ChangeSetFeed
from rebaser_server.changeset.group import CommitGroup
from rebaser_server.changeset.handling import RequestHandler
from rebaser_server.changeset.hooks import Hooks
from rebaser_server.changeset.outcome import Retry
from rebaser_server.changeset.postprocess import PostProcess
from rebaser_server.changeset.replies import Replies
from rebaser_server.changeset.trimmer import Trimmer
from rebaser_server.ops.observe import Observer
from rebaser_server.record.handle import ChangeSetHandle
from rebaser_server.record.store import ChangeSetStore, TaskDelivery
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.hostile_wire import REQUEST_HEADERS, dead_letter_of, stream_empty


class CommitApp(RecordingApp):
    """A ``RecordingApp`` with the optional commit hooks; ``before`` runs inside ``prepare_commit``."""

    def __init__(self) -> None:
        super().__init__()
        self.prepared: list[AppState] = []
        self.abandoned = 0
        self.before: Any = None

    async def prepare_commit(self, change_set: ChangeSet, state: AppState) -> None:
        self.prepared.append(state)
        if self.before is not None:
            await self.before()

    def abandon_commit(self, change_set: ChangeSet) -> None:
        self.abandoned += 1


class AtApplied(Hooks):
    """Runs ``at_applied`` at the "applied" checkpoint (after the commit, before the replies)."""

    def __init__(self) -> None:
        self.at_applied: Any = None
        self.reached = 0

    async def checkpoint(self, name: str, change_set: ChangeSet) -> None:
        if name == "applied":
            self.reached += 1
            if self.at_applied is not None:
                await self.at_applied()


async def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    return await coro


@dataclass
class Owned:
    """One change set owned by hand: its handle, commit group and post-process step, on real streams."""

    nc: NatsClient
    settings: Settings
    change_set: ChangeSet
    store: ChangeSetStore
    handle: ChangeSetHandle
    app: CommitApp
    hooks: AtApplied
    stats: Stats
    trimmer: Trimmer
    group: CommitGroup
    handler: RequestHandler
    lock: asyncio.Lock
    dvu_notified: list[None]  # one entry per DVU notification
    failures: list[Exception] = field(default_factory=list)

    def post(self, *, one_by_one: bool = False) -> PostProcess:
        return PostProcess(
            self.group,
            lock=self.lock,
            one_by_one=one_by_one,
            idempotency_window=self.settings.idempotency_window,
            on_failure=self.failures.append,
        )

    async def publish(self, headers: dict[str, str], body: bytes) -> tuple[Msg, int]:
        """Store a request; the message as the change set's consumer would deliver it, and its sequence."""
        cs = self.change_set
        subject = self.settings.subjects.requests(cs.workspace_id, cs.change_set_id)
        ack = await self.nc.jetstream().publish(subject, body, headers=headers)
        return Msg(_client=self.nc, subject=subject, data=body, headers=headers), ack.seq

    async def publish_request(self, inbox: str, **controls: Any) -> tuple[Msg, int, EnqueueUpdatesRequest]:
        cs = self.change_set
        request = EnqueueUpdatesRequest(
            id=RequestId.new(),
            workspace_id=cs.workspace_id,
            change_set_id=cs.change_set_id,
            updates=InlineUpdates(
                updates=[SetLiteral(path=f"/{k}", value=v) for k, v in (controls or {"n": 1}).items()]
            ),
        )
        headers, body = ENQUEUE_UPDATES_REQUEST.encode(request, reply_inbox=inbox)
        msg, seq = await self.publish(headers, body)
        return msg, seq, request

    async def publish_garbage(self, inbox: str) -> tuple[Msg, int]:
        return await self.publish(
            {**REQUEST_HEADERS, h.NATS_MSG_ID: str(RequestId.new()), h.REPLY_INBOX: inbox}, b"\xff"
        )

    async def decide(self, post: PostProcess, msg: Msg, seq: int) -> Decision:
        record = await post.open()
        return await self.handler.decide(msg, seq, record, unclean=False)

    async def stored_seqs(self) -> int:
        cs, subjects = self.change_set, self.settings.subjects
        subject = subjects.requests(cs.workspace_id, cs.change_set_id)
        info = await self.nc.jetstream().stream_info(subjects.requests_stream, subjects_filter=subject)
        return (info.state.subjects or {}).get(subject, 0)

    async def dead_letters(self) -> int:
        cs, subjects = self.change_set, self.settings.subjects
        subject = subjects.dead_letter(cs.workspace_id, cs.change_set_id)
        info = await self.nc.jetstream().stream_info(subjects.dead_letter_stream, subjects_filter=subject)
        return info.state.messages


@pytest.fixture
async def owned(nc: NatsClient, subject_prefix: str) -> AsyncIterator[Owned]:
    settings = fast_settings(subject_prefix)
    await ensure_streams(nc.jetstream(), settings, consumer=False)
    requester = Requester(nc)
    try:
        store = ChangeSetStore(nc.jetstream(), settings, requester)
        await store.open()
        cs = ChangeSet(WorkspacePk.new(), ChangeSetId.new())
        app = CommitApp()
        handle = (await store.acquire(cs, "owner", app.initial_state(cs), TaskDelivery(1, 1))).handle
        hooks, stats, observe = AtApplied(), Stats(), Observer()
        report = Report(stats, observe, hooks)
        trimmer = Trimmer(
            cs,
            settings.subjects,
            requester=requester,
            settings=settings,
            report=report,
            placement=Placement(),
        )
        replies = Replies(nc, settings, settings.subjects, stats, observe)
        handler = RequestHandler(
            cs, app=app, settings=settings, observe=observe, step=_run, subjects=settings.subjects
        )
        dvu_notified: list[None] = []
        group = CommitGroup(
            cs,
            handle,
            commit_hooks=CommitHooks.of(app),
            trimmer=trimmer,
            replies=replies,
            report=report,
            feed=ChangeSetFeed(
                cs,
                requester=requester,
                subjects=settings.subjects,
                owner="owner",
                stats=stats,
                timeout=5,
                enabled=settings.events,
            ),
            notify_dvu=lambda: dvu_notified.append(None),
        )
        state = Owned(
            nc,
            settings,
            cs,
            store,
            handle,
            app,
            hooks,
            stats,
            trimmer,
            group,
            handler,
            asyncio.Lock(),
            dvu_notified,
        )
        yield state
        await trimmer.flush(5)  # removals still in flight end before the connection does
    finally:
        await requester.close()


async def _inbox(nc: NatsClient, name: str) -> tuple[str, Subscription]:
    inbox = f"{nc.new_inbox()}.{name}"
    return inbox, await nc.subscribe(inbox)


async def _reply(sub: Subscription) -> EnqueueUpdatesResponse:
    msg = await sub.next_msg(timeout=5)
    return ENQUEUE_UPDATES_RESPONSE.decode(msg.headers, msg.data)


async def test_a_group_is_carried_out_in_order_dead_letters_commit_replies_removal_dvu(
    owned: Owned, nc: NatsClient
) -> None:
    refused_inbox, refused_sub = await _inbox(nc, "refused")
    applied_inbox, applied_sub = await _inbox(nc, "applied")
    bad_msg, bad_seq = await owned.publish_garbage(refused_inbox)
    good_msg, good_seq, good = await owned.publish_request(applied_inbox, dvu=True)
    post = owned.post()
    seen: dict[str, Any] = {}

    async def before_commit() -> None:  # the app's prepare_commit: after the dead letters, before the commit
        seen["dead letters at prepare"] = await owned.dead_letters()
        seen["record at prepare"] = await owned.store.read(owned.change_set)

    async def at_applied() -> None:  # after the commit, before the replies and the removal
        seen["record at applied"] = await owned.store.read(owned.change_set)
        await nc.flush()  # a reply published before now would be in by now (same connection)
        seen["replies at applied"] = refused_sub.pending_msgs + applied_sub.pending_msgs
        seen["stored at applied"] = await owned.stored_seqs()

    owned.app.before, owned.hooks.at_applied = before_commit, at_applied

    # The lock a request is handled under: the post-process timer cannot flush while it is held.
    async with owned.lock:
        refused = await owned.decide(post, bad_msg, bad_seq)
        assert refused.kind is Kind.REFUSED and refused.dead_letter is not None
        await post.carry_out(refused, waiting=1)  # one more behind it: the group grows
        assert owned.group.open and len(owned.group) == 1
        assert await owned.dead_letters() == 0 and await owned.store.read(owned.change_set) is None
        applied = await owned.decide(post, good_msg, good_seq)
        assert applied.kind is Kind.APPLIED and applied.dvu
        await post.carry_out(applied, waiting=0)  # nothing behind it: carried out now
    assert not owned.group.open and not owned.handle.lock.locked()

    # 1. dead letters, before 2. the commit
    assert seen["dead letters at prepare"] == 1 and seen["record at prepare"] is None
    assert owned.app.prepared == [{"applied": [str(good.id)], "dvu_runs": 0}]
    # 2. the commit (one for the group), before 3. the replies and 4. the removal
    committed = seen["record at applied"]
    assert committed is not None and committed.applied_seq == good_seq
    assert committed.state["applied"] == [str(good.id)] and committed.dvu_pending
    assert committed.recorded_status(str(good.id)) is not None
    assert seen["replies at applied"] == 0 and seen["stored at applied"] == 2
    # 3. the replies
    refused_reply, applied_reply = await _reply(refused_sub), await _reply(applied_sub)
    assert refused_reply.status.kind == "error" and "DecodeError" in refused_reply.status.message
    assert applied_reply.ok and applied_reply.id == good.id
    # 4. the removal
    await owned.trimmer.flush(5)
    assert await owned.stored_seqs() == 0
    # 5. the DVU, and the app told the group is over
    assert len(owned.dvu_notified) == 1 and owned.app.abandoned == 1
    letter = await dead_letter_of(
        nc, owned.settings, owned.change_set.workspace_id, owned.change_set.change_set_id
    )
    assert letter.headers is not None and letter.headers[h.DEAD_LETTER_SEQUENCE] == str(bad_seq)
    stats = owned.stats
    assert (stats.request_commits, stats.requests_applied, stats.requests_ok) == (1, 1, 1)
    assert (stats.requests_dead_lettered, stats.dead_letter_failures) == (1, 0)
    assert owned.hooks.reached == 1 and owned.failures == []


async def test_a_group_left_open_is_carried_out_by_the_timer(owned: Owned, nc: NatsClient) -> None:
    inbox, sub = await _inbox(nc, "soon")
    msg, seq, request = await owned.publish_request(inbox)
    post = owned.post()
    applied = await owned.decide(post, msg, seq)
    await post.carry_out(applied, waiting=3)  # more said to be behind it, but they never come
    reply = await _reply(sub)
    assert reply.ok and reply.id == request.id
    await wait_for(lambda: not owned.group.open, timeout=5, message="group closed")
    record = await owned.store.read(owned.change_set)
    assert record is not None and record.applied_seq == seq
    assert owned.stats.request_commits == 1 and owned.failures == []


async def test_a_fenced_group_commits_nothing_answers_nothing_and_removes_nothing(
    owned: Owned, nc: NatsClient
) -> None:
    inbox, sub = await _inbox(nc, "fenced")
    msg, seq, _ = await owned.publish_request(inbox)
    # Another owner takes the change set over and writes its record.
    intruder = (
        await owned.store.acquire(
            owned.change_set, "intruder", {"applied": [], "dvu_runs": 0}, TaskDelivery(2, 1)
        )
    ).handle
    await intruder.commit(intruder.record)
    post = owned.post()
    async with owned.lock:
        decision = await owned.decide(post, msg, seq)
        assert decision.kind is Kind.APPLIED
        with pytest.raises(FencedError):
            await post.carry_out(decision, waiting=0)
    assert not owned.group.open and not owned.handle.lock.locked() and owned.app.abandoned == 1
    record = await owned.store.read(owned.change_set)
    assert record is not None and record.owner == "intruder" and record.applied_seq == 0
    assert owned.hooks.reached == 0 and owned.stats.request_commits == 0 and owned.stats.requests_applied == 0
    await nc.flush()
    assert sub.pending_msgs == 0
    assert await owned.stored_seqs() == 1  # for the next owner


async def test_a_timer_flush_that_fails_ends_the_task(owned: Owned, nc: NatsClient) -> None:
    msg, seq, _ = await owned.publish_request(f"{nc.new_inbox()}.x")
    intruder = (
        await owned.store.acquire(
            owned.change_set, "intruder", {"applied": [], "dvu_runs": 0}, TaskDelivery(2, 1)
        )
    ).handle
    await intruder.commit(intruder.record)
    post = owned.post()
    await post.carry_out(await owned.decide(post, msg, seq), waiting=1)
    await wait_for(lambda: owned.failures, timeout=5, message="the timer's flush failed")
    assert isinstance(owned.failures[0], FencedError)
    assert not owned.group.open and not owned.handle.lock.locked()


async def test_a_retry_is_committed_at_once_with_what_came_before_it_then_ends_the_task(
    owned: Owned, nc: NatsClient
) -> None:
    first_inbox, first_sub = await _inbox(nc, "first")
    first_msg, first_seq, first = await owned.publish_request(first_inbox)
    flaky_msg, flaky_seq, flaky = await owned.publish_request(f"{nc.new_inbox()}.flaky", flaky=1)
    post = owned.post()
    async with owned.lock:
        await post.carry_out(await owned.decide(post, first_msg, first_seq), waiting=1)
        retry = await owned.decide(post, flaky_msg, flaky_seq)
        assert retry.kind is Kind.RETRY
        with pytest.raises(Retry):
            await post.carry_out(retry, waiting=0)
    record = await owned.store.read(owned.change_set)
    assert record is not None
    assert record.applied_seq == first_seq  # the flaky one stays first in line ...
    assert record.attempts == {str(flaky.id): 1}  # ... with its attempt on record
    assert (await _reply(first_sub)).id == first.id
    await owned.trimmer.flush(5)
    assert await owned.stored_seqs() == 1
    assert owned.stats.requests_retried == 1 and owned.stats.request_commits == 1


async def test_settling_a_group_no_longer_owned_drops_it(owned: Owned, nc: NatsClient) -> None:
    inbox, sub = await _inbox(nc, "dropped")
    msg, seq, _ = await owned.publish_request(inbox)
    post = owned.post()
    async with owned.lock:
        await post.carry_out(await owned.decide(post, msg, seq), waiting=5)
        await post.settle(owned=False)
    assert not owned.group.open and owned.app.abandoned == 1
    assert await owned.store.read(owned.change_set) is None and owned.app.prepared == []
    await nc.flush()
    assert sub.pending_msgs == 0 and await owned.stored_seqs() == 1
    # Still owned: settling carries the group out.
    async with owned.lock:
        await post.carry_out(await owned.decide(post, msg, seq), waiting=5)
        await post.settle(owned=True)
    assert (await _reply(sub)).ok
    record = await owned.store.read(owned.change_set)
    assert record is not None and record.applied_seq == seq


# -- end to end, through a daemon ------------------------------------------------------------------------------


class PauseAtFirstCommit(Hooks):
    """Pauses the first flush after its commit (the "applied" checkpoint) until released; counts every flush."""

    def __init__(self) -> None:
        self.flushes = 0
        self.reached = asyncio.Event()
        self.go_on = asyncio.Event()

    async def checkpoint(self, name: str, change_set: ChangeSet) -> None:
        if name == "applied":
            self.flushes += 1
            if self.flushes == 1:
                self.reached.set()
                await self.go_on.wait()


async def test_a_refused_and_an_applied_request_through_a_daemon(nc: NatsClient, subject_prefix: str) -> None:
    settings = fast_settings(subject_prefix)
    hooks = PauseAtFirstCommit()
    app = RecordingApp()
    async with running_daemon(nc, settings, app, hooks=hooks, sweep=False) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        change_set = ChangeSet(wk, cs)
        js, subjects = nc.jetstream(), settings.subjects
        bad_inbox, bad_sub = await _inbox(nc, "bad")
        good_inbox, good_sub = await _inbox(nc, "good")
        # Both stored before the task: the change set's consumer finds them queued together.
        bad_ack = await js.publish(
            subjects.requests(wk, cs),
            b"\xff\x00",
            headers={**REQUEST_HEADERS, h.NATS_MSG_ID: str(RequestId.new()), h.REPLY_INBOX: bad_inbox},
        )
        good = EnqueueUpdatesRequest(
            id=RequestId.new(),
            workspace_id=wk,
            change_set_id=cs,
            updates=InlineUpdates(updates=[SetLiteral(path="/n", value=1)]),
        )
        headers, body = ENQUEUE_UPDATES_REQUEST.encode(good, reply_inbox=good_inbox)
        good_ack = await js.publish(subjects.requests(wk, cs), body, headers=headers)
        await publish_task(nc, subjects.task(wk, cs))

        await asyncio.wait_for(hooks.reached.wait(), 10)
        # The first flush, paused after its commit: it holds the refused request (the first), so its dead letter
        # is stored and the record committed past it; no reply has gone out and nothing is removed yet.
        letter = await dead_letter_of(nc, settings, wk, cs)
        assert letter.headers is not None and letter.headers[h.DEAD_LETTER_SEQUENCE] == str(bad_ack.seq)
        record = await daemon.store.read(change_set)
        assert record is not None and record.applied_seq >= bad_ack.seq
        await nc.flush()
        assert bad_sub.pending_msgs == 0 and good_sub.pending_msgs == 0
        info = await js.stream_info(subjects.requests_stream)
        assert info.state.messages == 2
        hooks.go_on.set()

        bad_reply, good_reply = await _reply(bad_sub), await _reply(good_sub)
        assert bad_reply.status.kind == "error" and good_reply.ok and good_reply.id == good.id
        await wait_for(
            lambda: stream_empty(nc, subjects.requests_stream), message="processed requests removed"
        )
        record = await daemon.store.read(change_set)
        assert record is not None and record.applied_seq == good_ack.seq
        assert record.state["applied"] == [str(good.id)]
        stats = daemon.stats
        assert stats.requests_dead_lettered == 1 and stats.dead_letter_failures == 0
        assert stats.requests_applied == 1 and stats.requests_ok == 1
        # One commit per flush: one for both if they were grouped, else one each.
        assert 1 <= stats.request_commits == hooks.flushes <= 2
