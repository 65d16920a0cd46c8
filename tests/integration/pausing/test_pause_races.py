"""Pausing races, forced: a pause (and a resume) arriving at each point of a change set's ownership.

Each interleaving is forced, not slept into: the app is held inside an apply (``GatedApp``), or the daemon at a named
checkpoint (``CheckpointGate``); the test acts inside the window, then lets it go on. The orphan sweep is off in
every test, so only the pause protocol (the owner letting go, the release check, the resume's task) can move a
request: a request left without a task stays stranded and the test sees it.

What must hold, whatever the interleaving:

- while paused nothing is applied but the request in hand, which finishes, is committed and is answered;
- a resume leaves no request without a task: everything queued is applied, once each, in order;
- a pause and a resume issued together end in one of two states: paused (the key there, nothing applied since
  beyond the request in hand) or resumed (the key gone, everything applied);
- pausing what is paused already is no error and keeps the first pause.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.api import EnqueueUpdatesRequest
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.pause_store import open_pauses
from rebaser_core.nats.tasks import publish_task
from rebaser_core.pauses import Pause, change_set_key
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.app import Applied, AppState, ChangeSet
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.testing import CheckpointGate, fast_settings, running_daemon
from tests.support.apps import GatedApp, RecordingApp, applied

RACE_ITERATIONS = 50

_T = TypeVar("_T")


# -- helpers ---------------------------------------------------------------------------------------------------------
async def _seen_paused(daemon: Daemon, cs: ChangeSet) -> None:
    """Until the daemon's view of the bucket has the pause (its owner has been told by then)."""
    await wait_for(
        lambda: daemon.pauses.paused(cs) is not None, timeout=10, message="the daemon saw the pause"
    )


async def _has_task(nc: NatsClient, settings: Settings, cs: ChangeSet) -> bool:
    subject = settings.subjects.task(cs.workspace_id, cs.change_set_id)
    info = await nc.jetstream().stream_info(settings.subjects.tasks_stream, subjects_filter=subject)
    return bool((info.state.subjects or {}).get(subject))


async def _queued(nc: NatsClient, settings: Settings, cs: ChangeSet) -> int:
    subject = settings.subjects.requests(cs.workspace_id, cs.change_set_id)
    info = await nc.jetstream().stream_info(settings.subjects.requests_stream, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


async def _let_go(nc: NatsClient, settings: Settings, daemon: Daemon, cs: ChangeSet) -> None:
    """Until no daemon holds the change set and it has no task. An owner is in ``daemon.owned`` until its release
    (or its let-go) has run to the end, a task it publishes included: with the sweep off, nothing moves after this
    until the test acts."""

    async def quiet() -> bool:
        return cs not in daemon.owned and not await _has_task(nc, settings, cs)

    await wait_for(quiet, timeout=20, message=f"{cs} let go, with no task left")


async def _taken_while_paused_does_nothing(
    nc: NatsClient, settings: Settings, daemon: Daemon, cs: ChangeSet
) -> None:
    """Give the paused change set a task: a daemon takes it and lets it go untouched (its record not taken over)."""
    before, record = daemon.stats.tasks_paused, await daemon.store.read(cs)
    assert await publish_task(nc, settings.subjects.task(cs.workspace_id, cs.change_set_id))
    await wait_for(
        lambda: daemon.stats.tasks_paused > before, timeout=20, message="a task taken while paused was let go"
    )
    await _let_go(nc, settings, daemon, cs)
    assert await daemon.store.read(cs) == record, "a task taken while paused took the change set over"


async def _after(nc: NatsClient, round_trips: int, op: Awaitable[_T]) -> _T:
    """``op``, started after that many round trips to the server (a skew measured in the unit the race is run in,
    not in seconds)."""
    for _ in range(round_trips):
        await nc.flush()
    return await op


def _ids(*requests: RequestId) -> list[str]:
    return [str(r) for r in requests]


class PauseAwareApp(RecordingApp):
    """A ``RecordingApp`` that notes every apply begun while the daemon's view says the change set is paused (the
    view and the owner's ``pause()`` change together: only the request in hand may begin so)."""

    def __init__(self) -> None:
        super().__init__()
        self.daemon: Daemon | None = None
        self.begun_paused: list[str] = []

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        if self.daemon is not None and self.daemon.pauses.paused(change_set) is not None:
            self.begun_paused.append(str(request.id))
        return await super().apply(change_set, state, request)


# -- 1. a pause while a request is being applied ---------------------------------------------------------------------
@pytest.mark.parametrize("queued_behind", ["before", "after"])
async def test_a_pause_during_an_apply_finishes_the_request_in_hand_and_applies_no_other(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, queued_behind: str
) -> None:
    """``queued_behind``: the requests behind the one in hand were queued before it was delivered (it waits in an open
    commit group when its apply ends: the let-go must commit it), or after (it is committed at once)."""
    settings = fast_settings(subject_prefix)
    app = GatedApp()
    taking = CheckpointGate("acquired")
    if queued_behind == "after":
        taking.release()  # passes at once
    async with running_daemon(nc, settings, app, hooks=taking, sweep=False) as daemon:
        wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
        cs = ChangeSet(wk, cs_id)
        in_hand = asyncio.create_task(
            client.enqueue_updates_with_reply(wk, cs_id, [SetLiteral(path="/gate", value=True)], timeout=20)
        )
        behind: list[RequestId] = []
        if queued_behind == "before":
            await taking.wait_reached(timeout=20)  # taken, nothing delivered yet
            behind = [
                await client.enqueue_updates(wk, cs_id, [SetLiteral(path="/n", value=n)]) for n in range(3)
            ]
            taking.release()
        await wait_for(lambda: app.held == 1, timeout=20, message="the first request held inside its apply")
        if queued_behind == "after":
            behind = [
                await client.enqueue_updates(wk, cs_id, [SetLiteral(path="/n", value=n)]) for n in range(3)
            ]

        paused = await client.pause_change_set(wk, cs_id, "paused mid-apply")
        assert not paused.already
        await _seen_paused(daemon, cs)
        app.gate.set()  # the request in hand goes on

        reply = await in_hand
        assert reply.ok, reply.status  # finished, committed and answered
        await _let_go(nc, settings, daemon, cs)
        assert await applied(daemon.store, wk, cs_id) == _ids(reply.id)
        assert all(app.attempts[str(r)] == 0 for r in behind), "a request behind the one in hand was applied"
        assert await _queued(nc, settings, cs) == len(behind)
        assert daemon.stats.tasks_paused >= 1
        await _taken_while_paused_does_nothing(nc, settings, daemon, cs)
        assert await applied(daemon.store, wk, cs_id) == _ids(reply.id)

        resumed = await client.resume_change_set(wk, cs_id)
        assert resumed.was == paused.pause
        assert resumed.tasks_published == 1
        await client.wait_settled(wk, cs_id, timeout=30)
        assert await applied(daemon.store, wk, cs_id) == _ids(reply.id, *behind)
        assert all(app.attempts[r] == 1 for r in _ids(reply.id, *behind)), app.attempts
        assert await _queued(nc, settings, cs) == 0


async def test_a_resume_while_the_paused_owner_finishes_its_request_strands_nothing(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """The resume comes while the owner that saw the pause still applies its request in hand: the resume's task is
    refused (the owner still holds the change set's task), and the owner then lets go. Its requests queued behind must
    not be left without a task, the key gone."""
    settings = fast_settings(subject_prefix)
    app = GatedApp()
    async with running_daemon(nc, settings, app, sweep=False) as daemon:
        wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
        cs = ChangeSet(wk, cs_id)
        in_hand = asyncio.create_task(
            client.enqueue_updates_with_reply(wk, cs_id, [SetLiteral(path="/gate", value=True)], timeout=20)
        )
        await wait_for(lambda: app.held == 1, timeout=20, message="the first request held inside its apply")
        behind = [await client.enqueue_updates(wk, cs_id, [SetLiteral(path="/n", value=n)]) for n in range(3)]

        await client.pause_change_set(wk, cs_id, "paused mid-apply")
        await _seen_paused(daemon, cs)
        resumed = await client.resume_change_set(wk, cs_id)  # still inside the apply
        assert resumed.queued == 1 and resumed.tasks_existing == 1  # the owner still holds the task
        await wait_for(
            lambda: daemon.pauses.paused(cs) is None, timeout=10, message="the daemon saw the resume"
        )
        app.gate.set()

        reply = await in_hand
        assert reply.ok, reply.status
        await client.wait_settled(wk, cs_id, timeout=15)
        assert await applied(daemon.store, wk, cs_id) == _ids(reply.id, *behind)
        assert await _queued(nc, settings, cs) == 0


# -- 2. a pause while the change set is being released ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("window", "first"),
    [
        ("stopped_consuming", "request"),
        ("stopped_consuming", "pause"),
        ("task_acked", "pause"),
    ],
)
async def test_a_pause_during_the_release_applies_nothing_and_strands_nothing(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, window: str, first: str
) -> None:
    """Inside the release window (``stopped_consuming``: before the task ack; ``task_acked``: before the queued
    check), a pause and a late request, in either order. The late request is not applied while paused; the
    resume gives it a task and it is applied."""
    settings = fast_settings(subject_prefix, quiescent_period=0.02)
    gate = CheckpointGate(window)
    app = RecordingApp()
    async with running_daemon(nc, settings, app, hooks=gate, sweep=False) as daemon:
        wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
        cs = ChangeSet(wk, cs_id)
        head = await client.enqueue_updates_with_reply(
            wk, cs_id, [SetLiteral(path="/i", value=0)], timeout=20
        )
        assert head.ok
        assert await gate.wait_reached(timeout=20) == cs
        record = await daemon.store.read(cs)  # the releasing owner's last commit
        late: RequestId | None = None
        if first == "request":
            late = await client.enqueue_updates(wk, cs_id, [SetLiteral(path="/late", value=1)])
        await client.pause_change_set(wk, cs_id, f"paused at {window}")
        await _seen_paused(daemon, cs)
        if late is None:
            late = await client.enqueue_updates(wk, cs_id, [SetLiteral(path="/late", value=1)])
        gate.release()

        await _let_go(nc, settings, daemon, cs)
        assert await applied(daemon.store, wk, cs_id) == _ids(head.id)
        assert app.attempts[str(late)] == 0, "the late request was applied while paused"
        assert await _queued(nc, settings, cs) == 1
        # The late request had a task (the release check's, or its own): taken and let go untouched.
        assert daemon.stats.tasks_paused >= 1
        assert await daemon.store.read(cs) == record, "taken over while paused"

        resumed = await client.resume_change_set(wk, cs_id)
        assert resumed.tasks_published == 1
        await client.wait_settled(wk, cs_id, timeout=15)
        assert await applied(daemon.store, wk, cs_id) == _ids(head.id, late)
        assert await _queued(nc, settings, cs) == 0


# -- 3. a pause while the change set is being taken ------------------------------------------------------------------
async def test_a_pause_during_the_take_applies_nothing_and_lets_the_task_go(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    gate = CheckpointGate("acquired")
    app = RecordingApp()
    async with running_daemon(nc, settings, app, hooks=gate, sweep=False) as daemon:
        wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
        cs = ChangeSet(wk, cs_id)
        sent = [await client.enqueue_updates(wk, cs_id, [SetLiteral(path="/n", value=n)]) for n in range(3)]
        assert await gate.wait_reached(timeout=20) == cs  # its record taken over, nothing consumed yet
        await client.pause_change_set(wk, cs_id, "paused while taken")
        await _seen_paused(daemon, cs)
        paused_before = daemon.stats.tasks_paused
        gate.release()

        await _let_go(nc, settings, daemon, cs)  # the task acked: no task left, nobody holds it
        assert daemon.stats.tasks_paused == paused_before + 1
        assert await applied(daemon.store, wk, cs_id) == []
        assert not app.attempts, "a request was applied after a pause seen while taking the change set"
        assert await _queued(nc, settings, cs) == len(sent)

        resumed = await client.resume_change_set(wk, cs_id)
        assert resumed.tasks_published == 1
        await client.wait_settled(wk, cs_id, timeout=15)
        assert await applied(daemon.store, wk, cs_id) == _ids(*sent)
        assert all(app.attempts[r] == 1 for r in _ids(*sent)), app.attempts


# -- 4. a pause and a resume issued together -------------------------------------------------------------------------
async def test_a_pause_racing_a_resume_ends_paused_or_resumed_never_in_between(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """Each iteration: requests that take a little while to apply, the first of them in hand; then a pause and a
    resume at once (issued in both orders). Ended paused: the key is there, nothing was begun since the daemon saw
    the pause but the request in hand, and the change set is let go with its queue kept; then resumed. Ended resumed:
    everything is applied without any other help (the sweep is off). Either way: every request once, in order."""
    settings = fast_settings(subject_prefix)
    app = PauseAwareApp()
    async with running_daemon(nc, settings, app, sweep=False) as daemon:
        app.daemon = daemon
        wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
        cs = ChangeSet(wk, cs_id)
        sent: list[str] = []
        ended = {"paused": 0, "resumed": 0}
        for i in range(RACE_ITERATIONS):
            batch = [
                str(await client.enqueue_updates(wk, cs_id, [SetLiteral(path="/sleep", value=0.01)]))
                for _ in range(3)
            ]
            sent += batch
            await wait_for(
                lambda b=batch: app.attempts[b[0]] > 0, timeout=20, message=f"iteration {i}: in hand"
            )
            begun_paused = len(app.begun_paused)
            # Issued together, one of them held back by 0 to 4 round trips to the server (a pause's create takes
            # three of them over the delete marker a resume leaves, a resume's delete two): both orders happen.
            skew, late = i % 5, "resume" if (i // 5) % 2 == 0 else "pause"
            await asyncio.gather(
                _after(nc, skew if late == "pause" else 0, client.pause_change_set(wk, cs_id, f"race {i}")),
                _after(nc, skew if late == "resume" else 0, client.resume_change_set(wk, cs_id)),
            )

            own, _ = await client.pause_of(wk, cs_id)
            if own is None:
                ended["resumed"] += 1
                try:
                    await client.wait_settled(wk, cs_id, timeout=10)
                except Exception as err:
                    raise AssertionError(
                        f"iteration {i}: resumed (no pause key) but not settled: {await _queued(nc, settings, cs)} "
                        f"requests queued, task: {await _has_task(nc, settings, cs)}, "
                        f"owned: {cs in daemon.owned} ({err!r})"
                    ) from None
            else:
                ended["paused"] += 1
                assert own.reason == f"race {i}"
                await _let_go(nc, settings, daemon, cs)
                done = await applied(daemon.store, wk, cs_id)
                assert done == sent[: len(done)]
                assert len(app.begun_paused) - begun_paused <= 1, (
                    f"iteration {i}: applies begun after the pause was seen: {app.begun_paused[begun_paused:]}"
                )
                assert await _queued(nc, settings, cs) == len(sent) - len(done)
                resumed = await client.resume_change_set(wk, cs_id)
                assert resumed.was == own
                await client.wait_settled(wk, cs_id, timeout=10)
            assert await applied(daemon.store, wk, cs_id) == sent, f"iteration {i}"
            assert await _queued(nc, settings, cs) == 0
        assert all(app.attempts[r] == 1 for r in sent), "a request was applied twice"
        assert not app.overlaps
        print(f"pause/resume race: {ended}")


# -- 5. a pause of what is paused already ----------------------------------------------------------------------------
async def test_pausing_a_paused_change_set_keeps_the_first_pause(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp(), sweep=False) as daemon:
        wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
        cs = ChangeSet(wk, cs_id)
        first = await client.pause_change_set(wk, cs_id, "first")
        assert not first.already and first.pause.reason == "first" and first.pause.cause == "operator"
        await _seen_paused(daemon, cs)

        again = await client.pause_change_set(wk, cs_id, "second")
        assert again.already and again.pause == first.pause
        # Many at once: each one is told it was paused already, and keeps the first pause.
        many = await asyncio.gather(*(client.pause_change_set(wk, cs_id, f"more {n}") for n in range(10)))
        assert all(r.already and r.pause == first.pause for r in many)

        kv = await open_pauses(nc.jetstream(), settings.subjects, create=False)
        assert kv is not None
        entry = await kv.get(change_set_key(wk, cs_id))
        assert Pause.decode(entry.value or b"") == first.pause and entry.revision is not None
        assert (await client.pause_of(wk, cs_id))[0] == first.pause
        assert daemon.pauses.paused(cs) == first.pause
        assert daemon.pauses.pauses["operator"] == 1  # one pause, counted once

        resumed = await client.resume_change_set(wk, cs_id)
        assert resumed.was == first.pause
        # Paused anew after the resume: a new pause, not "already".
        fresh = await client.pause_change_set(wk, cs_id, "third")
        assert not fresh.already and fresh.pause.reason == "third"


async def test_concurrent_first_pauses_store_one(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """Pauses of a change set that is not paused, all at once: one is stored, every other is told ``already``."""
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp(), sweep=False):
        wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
        results = await asyncio.gather(*(client.pause_change_set(wk, cs_id, f"p{n}") for n in range(10)))
        stored = [r for r in results if not r.already]
        assert len(stored) == 1
        assert all(r.pause == stored[0].pause for r in results)
        assert (await client.pause_of(wk, cs_id))[0] == stored[0].pause
