"""Waiting until a change set is settled: the daemon holds the answer until nothing is queued and no DVU is due."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from rebaser_client import RebaserClient, RebaserRefused, RebaserTimeout, SetLiteral
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.ops.daemon_metrics import DaemonCollector
from rebaser_server.ops.metrics import render
from rebaser_server.queries.settled import settled_now
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp


async def test_wait_returns_only_after_the_dvu_ran(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    app = RecordingApp()
    app.dvu_gate = asyncio.Event()  # a slow DVU: it runs only once the test lets it
    async with running_daemon(nc, fast_settings(subject_prefix), app) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        for n in range(3):
            await client.enqueue_updates(wk, cs, [SetLiteral(path="/dvu", value=n)])
        waiting = asyncio.create_task(client.wait_settled(wk, cs, timeout=30))

        async def applied_all() -> bool:
            record = await daemon.store.read(ChangeSet(wk, cs))
            return record is not None and len(record.state["applied"]) == 3 and record.dvu_pending

        await wait_for(applied_all, message="the three requests applied, DVU due")
        # Everything is applied, but the DVU has not run: not settled, the wait is still held (and shown).
        assert not waiting.done()
        assert app.dvu_runs[str(ChangeSet(wk, cs))] == 0
        await wait_for(lambda: daemon.queries.settled.held == 1, message="the wait is held")
        assert (await daemon.status())["settled_waits"] == 1
        daemon.observe.metrics.bind(DaemonCollector(daemon))  # as the HTTP server does
        assert "rebaser_settled_waits 1.0" in render(daemon.observe.metrics).decode()
        app.dvu_gate.set()
        answer = await asyncio.wait_for(waiting, 20)
        assert answer.settled and not answer.queued and not answer.dvu_pending
        assert app.dvu_runs[str(ChangeSet(wk, cs))] >= 1
        record = await daemon.store.read(ChangeSet(wk, cs))
        assert record is not None and not record.dvu_pending and record.state["dvu_runs"] >= 1


async def test_a_record_seen_before_its_request_was_processed_is_read_again(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # The race: the wait reads the record (none yet), the owner then commits the request (DVU due) and deletes it,
    # and the wait finds no request left: settled, with the DVU still to run. Replayed here in order.
    app = RecordingApp()
    app.dvu_gate = asyncio.Event()  # the DVU stays due, the change set owned
    async with running_daemon(nc, fast_settings(subject_prefix), app) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        change_set = ChangeSet(wk, cs)
        names = daemon.settings.subjects.for_shard(daemon.layout.shard_of(wk, cs))
        # The record as the wait saw it: before the request was processed.
        before = await daemon.store.read(change_set)
        assert before is None
        await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/dvu", value=1)], timeout=10)

        async def request_deleted() -> bool:
            try:
                await daemon.nats.js.get_last_msg(names.requests_stream, names.requests(wk, cs))
            except NotFoundError:
                return True
            return False

        await wait_for(request_deleted, message="the processed request deleted")
        answer = await settled_now(
            daemon.nats.js, daemon.settings.subjects, daemon.layout, change_set, RequestId.new(), before
        )
        assert not answer.settled and answer.dvu_pending and answer.owned and answer.applied_seq >= 1
        app.dvu_gate.set()
        assert (await client.wait_settled(wk, cs, timeout=20)).settled
        assert app.dvu_runs[str(change_set)] >= 1


async def test_a_change_set_with_nothing_going_on_is_settled_at_once(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()):
        answer = await client.wait_settled(WorkspacePk.new(), ChangeSetId.new(), timeout=10)
        assert answer.settled and not answer.owned and answer.applied_seq == 0
        # A timeout longer than one daemon holds a wait (MAX_SETTLED_WAIT) is fine: the client asks again.
        assert (await client.wait_settled(WorkspacePk.new(), ChangeSetId.new(), timeout=7200)).settled


async def test_not_settled_in_time_is_a_timeout(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    app = RecordingApp()
    app.dvu_gate = asyncio.Event()
    async with running_daemon(nc, fast_settings(subject_prefix), app):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/dvu", value=1)], timeout=10)
        with pytest.raises(RebaserTimeout, match="not settled"):
            await client.wait_settled(wk, cs, timeout=0.5)
        app.dvu_gate.set()
        assert (await client.wait_settled(wk, cs, timeout=20)).settled


async def test_a_wait_held_by_a_daemon_that_stops_is_asked_again(
    nats_url: str, nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, shutdown_grace=1.0)
    app = RecordingApp()
    app.dvu_gate = asyncio.Event()  # the DVU cannot finish: the change set stays unsettled meanwhile
    other = await nats.connect(nats_url)
    try:
        async with running_daemon(nc, settings, app) as first:
            wk, cs = WorkspacePk.new(), ChangeSetId.new()
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/dvu", value=1)], timeout=10)
            waiting = asyncio.create_task(client.wait_settled(wk, cs, timeout=60))
            await wait_for(lambda: first.queries.settled.held == 1, message="the first daemon holds the wait")
            async with running_daemon(other, settings, app) as second:
                await first.shutdown()  # answers "ask again"; the client asks the second daemon
                await wait_for(lambda: second.queries.settled.held == 1, message="the second daemon holds it")
                assert not waiting.done()
                app.dvu_gate.set()
                answer = await asyncio.wait_for(waiting, 20)
                assert answer.settled and not answer.dvu_pending
    finally:
        await other.close()


async def test_a_timeout_that_is_not_a_number_is_refused_not_asked_forever(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # NaN never reaches a deadline: the client would ask again at once, forever, while the change set stays unsettled.
    app = RecordingApp()
    app.dvu_gate = asyncio.Event()
    async with running_daemon(nc, fast_settings(subject_prefix), app):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/dvu", value=1)], timeout=10)
        for bad in (float("nan"), -1.0):
            async with asyncio.timeout(10):
                with pytest.raises(RebaserRefused, match="timeout must be a number of seconds >= 0"):
                    await client.wait_settled(wk, cs, timeout=bad)
        app.dvu_gate.set()
        assert (await client.wait_settled(wk, cs, timeout=20)).settled
