"""No window strands a request until the orphan sweep: every test here runs its daemon without the sweep, so only
the enqueue and release protocols can get the request served."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral, _publisher
from rebaser_core.api import EnqueueUpdatesRequest, InlineUpdates
from rebaser_core.errors import RebaserUnavailable
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.testing import CheckpointGate, fast_settings, running_daemon
from tests.support.apps import RecordingApp, applied


async def test_a_caller_cancelled_between_its_two_publishes_still_leaves_a_task(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, go_on = asyncio.Event(), asyncio.Event()
    real_publish_task = _publisher.publish_task

    async def slow_publish_task(*args: Any, **kwargs: Any) -> bool:
        entered.set()  # the request is in the stream; its task is not yet
        await go_on.wait()
        return await real_publish_task(*args, **kwargs)

    monkeypatch.setattr(_publisher, "publish_task", slow_publish_task)
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp(), sweep=False) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        call = asyncio.create_task(client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=1)]))
        await asyncio.wait_for(entered.wait(), 10)
        call.cancel()  # as the caller's reply timeout would, between the two publishes
        with pytest.raises(asyncio.CancelledError):
            await call
        go_on.set()

        async def served() -> bool:
            return len(await applied(daemon.store, wk, cs)) == 1

        await wait_for(served, timeout=10, message="request served without the orphan sweep")


def _requests_stored_late(
    nc: NatsClient, monkeypatch: pytest.MonkeyPatch, events: list[str]
) -> tuple[asyncio.Event, set[asyncio.Future[None]]]:
    """Request publishes on ``nc`` held back until the returned event is set, then sent ("request stored" in
    ``events``), whatever their caller does meanwhile; the set holds those on their way."""
    go_on, sent = asyncio.Event(), set()
    real_publish = nc.publish

    async def stored_late(subject: str, *args: Any, **kwargs: Any) -> None:
        if ".requests." not in subject or go_on.is_set():
            return await real_publish(subject, *args, **kwargs)

        async def later() -> None:
            await go_on.wait()
            events.append("request stored")
            await real_publish(subject, *args, **kwargs)

        sent.add(asyncio.ensure_future(later()))  # on its way whatever the caller does

    monkeypatch.setattr(nc, "publish", stored_late)
    return go_on, sent


async def test_a_caller_cancelled_before_its_request_is_stored_leaves_a_task_after_it(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled (its timeout, say) after the request went out but before the stream stored it (a slow leader, an
    election): the request will be stored, so its task must be published all the same, and only after the store
    (a task that reaches a daemon first finds nothing queued), and the in-flight slot freed once that is done."""
    events: list[str] = []
    go_on, sent = _requests_stored_late(nc, monkeypatch, events)
    real_publish_task = _publisher.publish_task

    async def recorded_publish_task(*args: Any, **kwargs: Any) -> bool:
        events.append("task")
        return await real_publish_task(*args, **kwargs)

    monkeypatch.setattr(_publisher, "publish_task", recorded_publish_task)
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp(), sweep=False) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        call = asyncio.create_task(client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=1)]))
        await wait_for(lambda: len(sent) == 1, timeout=10, message="request sent")
        assert client.status().in_flight == 1
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

        def finishing() -> (
            bool
        ):  # the cancelled caller's rest: waiting for the ack (or, wrongly, on to the task)
            return "task" in events or any(getattr(f, "_fut_waiter", None) for f in _publisher._UNFINISHED)

        await wait_for(finishing, timeout=10, message="the publish finishing in the background")
        go_on.set()

        async def served() -> bool:
            return len(await applied(daemon.store, wk, cs)) == 1

        await wait_for(served, timeout=10, message="request served without the orphan sweep")
        await wait_for(lambda: client.status().in_flight == 0, timeout=10, message="slot freed")
        assert events == ["request stored", "task"]


async def test_closing_the_client_lets_a_cancelled_callers_task_go_out_first(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caller cancelled while its request's ack is on its way, then the client closed at once (a process that
    # stops): the request is stored, and its task must go out before close() returns, not be left to the sweep.
    events: list[str] = []
    go_on, sent = _requests_stored_late(nc, monkeypatch, events)
    real_publish_task = _publisher.publish_task

    async def recorded_publish_task(*args: Any, **kwargs: Any) -> bool:
        published = await real_publish_task(*args, **kwargs)
        events.append("task published")  # once JetStream acknowledged it
        return published

    monkeypatch.setattr(_publisher, "publish_task", recorded_publish_task)
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp(), sweep=False) as daemon:
        client = RebaserClient(nc, prefix=subject_prefix)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        call = asyncio.create_task(client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=1)]))
        await wait_for(lambda: len(sent) == 1, timeout=10, message="request sent")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        closing = asyncio.ensure_future(client.close())
        go_on.set()
        await closing
        assert events == ["request stored", "task published"]  # before close() returned

        async def served() -> bool:
            return len(await applied(daemon.store, wk, cs)) == 1

        await wait_for(served, timeout=10, message="request served without the orphan sweep")


async def test_a_task_publish_refused_during_a_leader_election_is_retried(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the tasks stream elects a leader, its subjects have no responders for a second or so (the leader
    step-down battery in ``tests/chaos/test_chaos.py`` shows it). The request is stored by then; its task must still
    get in."""
    real_publish_task = _publisher.publish_task
    refusals = 3

    async def electing(*args: Any, **kwargs: Any) -> bool:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise RebaserUnavailable("no JetStream stream answers (a leader election)")
        return await real_publish_task(*args, **kwargs)

    monkeypatch.setattr(_publisher, "publish_task", electing)
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp(), sweep=False) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=1)])
        assert refusals == 0

        async def served() -> bool:
            return len(await applied(daemon.store, wk, cs)) == 1

        await wait_for(served, timeout=10, message="request served without the orphan sweep")


async def test_a_failing_queued_check_after_release_is_retried(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, quiescent_period=0.05)
    gate = CheckpointGate("stopped_consuming")
    js = nc.jetstream()
    async with running_daemon(nc, settings, RecordingApp(), hooks=gate, sweep=False) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        assert (
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=10)
        ).ok
        await gate.wait_reached()
        # Inside the release window: a request whose task publish is refused (the task still exists) ...
        before = (await js.stream_info(settings.subjects.requests_stream)).state.last_seq
        late = asyncio.create_task(
            client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=2)], timeout=15)
        )

        async def published() -> bool:
            return (await js.stream_info(settings.subjects.requests_stream)).state.last_seq > before

        await wait_for(published, timeout=5, message="late request durable")
        # ... and the first "anything queued?" check after the ack fails (a leader election, a timeout).
        real_queued = daemon.nats.queued
        failures = 0

        async def flaky_queued(change_set: ChangeSet, **kwargs: Any) -> bool:
            nonlocal failures
            if failures == 0:
                failures += 1
                raise TimeoutError("injected: no answer")
            return await real_queued(change_set, **kwargs)

        daemon.nats.queued = flaky_queued  # type: ignore[method-assign]
        gate.release()
        assert (await late).ok
        assert failures == 1


async def test_a_resent_request_whose_reply_was_lost_gets_the_recorded_reply(
    nc: NatsClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        request = EnqueueUpdatesRequest(
            id=RequestId.new(),
            workspace_id=wk,
            change_set_id=cs,
            updates=InlineUpdates(updates=[SetLiteral(path="/n", value=1)]),
        )
        # The first client publishes with a reply inbox and is gone before the reply comes (a crash, a node kill):
        # the request is applied, its reply goes nowhere.
        async with RebaserClient(nc, prefix=subject_prefix) as first:
            await first._enqueue(request, nc.new_inbox())  # an inbox nobody will listen to

            async def committed() -> bool:
                return await applied(daemon.store, wk, cs) == [str(request.id)]

            await wait_for(committed, timeout=10, message="first publish applied")
        # The caller retries with the same id, within the stream's duplicate window: the publish is dropped as a
        # duplicate, so no daemon sees it again. The reply must come all the same, from the change set's record.
        async with RebaserClient(nc, prefix=subject_prefix) as second:
            response = await second.send(request, timeout=10)
        assert response is not None and response.ok and response.id == request.id
        assert await applied(daemon.store, wk, cs) == [str(request.id)]  # applied once
