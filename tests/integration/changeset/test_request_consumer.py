"""The owned change set's ordered consumer (``rebaser_server/changeset/consumer.py``) under loss, silence and forgery.

Each test breaks the stream of deliveries the way the network, the server or a hostile publisher on the inbox
could, and checks the promise: every request applied exactly once, in stream order, and the consumer count back
to one per owned change set.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.api import EnqueueUpdatesRequest
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.app import Applied, AppState, ChangeSet
from rebaser_server.changeset.consumer import RequestConsumer
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import GatedApp, RecordingApp, applied


def _settings(prefix: str, **overrides: Any) -> Settings:
    # Owned for the whole test: a release would hide a consumer that stopped delivering behind a fresh activation.
    return fast_settings(prefix, quiescent_period=30.0, **overrides)


def _consumer(daemon: Daemon) -> RequestConsumer:
    (processor,) = daemon._owned.processors()
    return processor._consumer


async def bound_consumer(daemon: Daemon) -> RequestConsumer:
    """The one owned change set's request consumer, once bound."""
    await wait_for(lambda: len(daemon._owned) == 1, timeout=10, message="the change set owned")
    consumer = _consumer(daemon)
    await wait_for(
        lambda: consumer._sub is not None and consumer.name is not None,
        timeout=10,
        message="its consumer bound",
    )
    return consumer


async def _one_consumer(nc: NatsClient, settings: Settings) -> None:
    """The stream's consumers come down to the owned change set's one (a replaced one is deleted)."""

    async def one() -> bool:
        info = await nc.jetstream().stream_info(settings.subjects.requests_stream)
        return info.state.consumer_count == 1

    await wait_for(one, timeout=10, message="one consumer left")


async def _enqueue(
    client: RebaserClient, wk: WorkspacePk, cs: ChangeSetId, n: int, tag: str
) -> list[RequestId]:
    return [await client.enqueue_updates(wk, cs, [SetLiteral(path=f"/{tag}", value=i)]) for i in range(n)]


async def _serving(
    daemon: Daemon, client: RebaserClient, n: int, tag: str
) -> tuple[WorkspacePk, ChangeSetId, list[RequestId], RequestConsumer]:
    """A new change set owned by ``daemon``, ``n`` requests applied: its ids, its requests and its bound consumer."""
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    ids = await _enqueue(client, wk, cs, n, tag)
    await _all_applied(daemon, wk, cs, ids)
    return wk, cs, ids, await bound_consumer(daemon)


async def _all_applied(daemon: Daemon, wk: WorkspacePk, cs: ChangeSetId, ids: list[RequestId]) -> None:
    want = [str(i) for i in ids]

    async def done() -> bool:
        return len(await applied(daemon.store, wk, cs)) >= len(want)

    await wait_for(done, timeout=20, message=f"{len(want)} requests applied")
    assert await applied(daemon.store, wk, cs) == want  # each once, in stream order
    assert daemon.stats.requests_replayed == 0  # none delivered twice and answered from the record


async def test_a_lost_delivery_resets_the_consumer_after_the_last_request_taken(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """A delivery lost between server and daemon (dropped here as the daemon reads it) shows as a skipped consumer
    sequence in the next one. The consumer is replaced; the requests already queued in the daemon stay, and the new
    consumer starts after the last one taken, so none is applied twice or skipped."""
    settings, app = _settings(subject_prefix), GatedApp()
    async with running_daemon(nc, settings, app) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        ids = [await client.enqueue_updates(wk, cs, [SetLiteral(path="/gate", value=True)])]
        await wait_for(lambda: app.held == 1, timeout=10, message="the first request in the app")
        consumer = await bound_consumer(daemon)
        old, lost = consumer.name, []
        take = consumer._on_delivery

        def losing_the_third(msg: Msg, reply: str) -> None:
            if consumer._seq.expected == 3 and not lost:
                lost.append(reply)
                return
            take(msg, reply)

        consumer._on_delivery = losing_the_third  # type: ignore[method-assign]
        ids += await _enqueue(client, wk, cs, 5, "queued")
        await wait_for(
            lambda: consumer.resets == 1 and consumer.name not in (None, old),
            timeout=10,
            message="the consumer replaced",
        )
        assert lost
        app.gate.set()
        ids += await _enqueue(client, wk, cs, 3, "after")
        await _all_applied(daemon, wk, cs, ids)
        assert sum(app.attempts.values()) == len(ids)
        assert daemon.stats.consumer_resets == 1
        await _one_consumer(nc, settings)


async def test_a_consumer_gone_from_the_server_is_replaced_after_two_silent_heartbeats(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """The server forgets a memory consumer (a restart, an operator's delete): no message and no heartbeat comes.
    The lease keeper's tick sees the silence and replaces it where it left off."""
    settings, app = _settings(subject_prefix, consumer_heartbeat=0.2), RecordingApp()
    async with running_daemon(nc, settings, app) as daemon:
        wk, cs, ids, consumer = await _serving(daemon, client, 3, "before")
        old = consumer.name
        assert old is not None
        await nc.jetstream().delete_consumer(settings.subjects.requests_stream, old)
        ids += await _enqueue(
            client, wk, cs, 3, "while_gone"
        )  # queued in the stream, no consumer to deliver them
        await _all_applied(daemon, wk, cs, ids)
        assert consumer.resets >= 1 and consumer.name != old
        assert sum(app.attempts.values()) == len(ids)
        await _one_consumer(nc, settings)


async def test_a_heartbeat_naming_a_later_delivery_resets_the_consumer(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """A delivery lost at the tail is seen only in the next idle heartbeat's last consumer sequence."""
    settings, app = _settings(subject_prefix), RecordingApp()
    async with running_daemon(nc, settings, app) as daemon:
        wk, cs, ids, consumer = await _serving(daemon, client, 2, "before")
        heartbeat = {"Status": "100", "Description": "Idle Heartbeat", "Nats-Last-Consumer": "1000"}
        await nc.publish(consumer.inbox, b"", headers=heartbeat)
        await wait_for(lambda: consumer.resets == 1, timeout=10, message="the consumer reset")
        ids += await _enqueue(client, wk, cs, 2, "after")
        await _all_applied(daemon, wk, cs, ids)
        assert sum(app.attempts.values()) == len(ids)


async def test_what_is_not_the_servers_is_ignored_and_flow_control_goes_only_to_the_server(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """A message on the inbox that is neither a delivery nor the server's status is dropped; a flow-control request
    or a stalled heartbeat naming any subject but this stream's ``$JS.FC.`` ones is not answered (no reflection
    through the daemon, not even to another stream's consumers)."""
    settings, app = _settings(subject_prefix), RecordingApp()
    stream = settings.subjects.requests_stream
    elsewhere: list[str] = []
    answered: list[str] = []

    async def on_elsewhere(msg: Msg) -> None:
        elsewhere.append(msg.subject)

    async def on_answer(msg: Msg) -> None:
        answered.append(msg.subject)

    victim = await nc.subscribe("victim.>", cb=on_elsewhere)
    other = await nc.subscribe("$JS.FC.OTHER_STREAM.>", cb=on_elsewhere)
    server = await nc.subscribe(f"$JS.FC.{stream}.forged.>", cb=on_answer)
    try:
        async with running_daemon(nc, settings, app) as daemon:
            wk, cs, ids, consumer = await _serving(daemon, client, 1, "first")
            inbox = consumer.inbox
            await nc.publish(inbox, b"not a delivery")
            await nc.publish(inbox, b"", reply="victim.reply")
            flow = {"Status": "100", "Description": "FlowControl Request"}
            await nc.publish(inbox, b"", reply="victim.flow", headers=flow)
            await nc.publish(inbox, b"", reply="$JS.FC.OTHER_STREAM.x.1", headers=flow)
            stalled = {
                "Status": "100",
                "Description": "Idle Heartbeat",
                "Nats-Consumer-Stalled": "victim.stall",
            }
            await nc.publish(inbox, b"", headers=stalled)  # no last consumer sequence: no reset either
            await nc.publish(inbox, b"", reply=f"$JS.FC.{stream}.forged.1", headers=flow)
            # The daemon reads its inbox in order: once the last is answered, the others were read and dropped.
            await wait_for(
                lambda: answered == [f"$JS.FC.{stream}.forged.1"],
                timeout=10,
                message="the server's subject answered",
            )
            await nc.flush()
            assert elsewhere == []
            assert consumer.resets == 0
            ids += await _enqueue(client, wk, cs, 1, "after")
            await _all_applied(daemon, wk, cs, ids)
    finally:
        for sub in (victim, other, server):
            await sub.unsubscribe()


async def test_a_client_cannot_send_a_delivery_subject(nc: NatsClient) -> None:
    """Forging a delivery over the wire needs a ``$JS.ACK.`` reply subject, and nats-server refuses a client's
    publish with one: what the tests below inject by hand cannot come from another client."""
    got: list[str | None] = []

    async def on_message(msg: Msg) -> None:
        got.append(msg.reply or None)

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=on_message)
    try:
        await nc.publish(inbox, b"forged", reply="$JS.ACK.S.C.1.1.1.0.0")
        await nc.publish(inbox, b"marker")
        await wait_for(lambda: got, timeout=10, message="the marker delivered")
        assert got == [None]  # the marker alone: the forged delivery was refused
    finally:
        await sub.unsubscribe()


async def test_deliveries_not_of_this_consumer_or_not_later_are_dropped(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """Injected as if the server had sent them (the wire refuses them from clients): a delivery naming another
    consumer or stream, and one with the next consumer sequence but an earlier stream sequence. None is applied,
    none resets the consumer, and the change set goes on from where the server's deliveries left it."""
    settings, app = _settings(subject_prefix), RecordingApp()
    stream = settings.subjects.requests_stream
    async with running_daemon(nc, settings, app) as daemon:
        wk, cs, ids, consumer = await _serving(daemon, client, 2, "before")
        body = b"forged"
        nxt, last = consumer._seq.expected, consumer._seq.last_stream_seq
        for reply in (
            f"$JS.ACK.{stream}.someone_else.1.{last + 1}.{nxt}.0.0",
            f"$JS.ACK.OTHER_STREAM.{consumer.name}.1.{last + 1}.{nxt}.0.0",
            f"$JS.ACK._.HASH.{stream}.someone_else.1.{last + 1}.{nxt}.0.0.tok",
            f"$JS.ACK.{stream}.{consumer.name}.1.{last}.{nxt}.0.0",  # a replay of the last one
            f"$JS.ACK.{stream}.{consumer.name}.1.1.{nxt}.0.0",
        ):
            consumer._on_message(
                consumer.inbox, Msg(nc, subject=settings.subjects.requests(wk, cs), reply=reply, data=body)
            )
        assert consumer._flow.received == len(ids) and consumer.resets == 0
        assert (consumer._seq.expected, consumer._seq.last_stream_seq) == (nxt, last)
        ids += await _enqueue(client, wk, cs, 2, "after")
        await _all_applied(daemon, wk, cs, ids)
        assert sum(app.attempts.values()) == len(ids)


async def test_a_consumer_replaced_by_a_reset_is_freed_with_its_change_set(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, no_cycle_collector: None
) -> None:
    """The reset path leaves no reference cycle: once the change set is released, its consumer is gone by
    reference counting alone (the collector is off)."""
    settings, app = fast_settings(subject_prefix), GatedApp()
    async with running_daemon(nc, settings, app) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        ids = [await client.enqueue_updates(wk, cs, [SetLiteral(path="/gate", value=True)])]
        await wait_for(lambda: app.held == 1, timeout=10, message="the first request in the app")
        ref = weakref.ref(await bound_consumer(daemon))
        heartbeat = {"Status": "100", "Description": "Idle Heartbeat", "Nats-Last-Consumer": "1000"}
        await nc.publish(_alive(ref).inbox, b"", headers=heartbeat)
        await wait_for(lambda: _alive(ref).resets == 1, timeout=10, message="the consumer reset")
        await wait_for(lambda: _alive(ref)._sub is not None, timeout=10, message="the new inbox subscribed")
        app.gate.set()
        await _all_applied(daemon, wk, cs, ids)
        await wait_for(lambda: not len(daemon._owned), timeout=10, message="the change set released")
        await wait_for(lambda: ref() is None, timeout=10, message="the replaced consumer freed")


def _alive(ref: weakref.ref[RequestConsumer]) -> RequestConsumer:
    consumer = ref()
    assert consumer is not None
    return consumer


async def test_a_stored_request_that_looks_like_a_heartbeat_is_a_request(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """A request published with an empty body and ``Status: 100`` headers is still a delivery (it has an ack
    subject): it is refused as a request and the change set goes on, instead of being skipped as a control message
    (as nats-py's ordered consumer skips it, breaking the sequence and resetting the consumer onto it again and
    again)."""
    settings, app = _settings(subject_prefix), RecordingApp()
    async with running_daemon(nc, settings, app) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        headers = {"Status": "100", "Description": "Idle Heartbeat", "Nats-Last-Consumer": "7"}
        await nc.jetstream().publish(settings.subjects.requests(wk, cs), b"", headers=headers)
        reply = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/x", value=1)], timeout=20)
        assert reply.ok
        consumer = await bound_consumer(daemon)
        assert consumer.resets == 0
        assert len(await applied(daemon.store, wk, cs)) == 1
        await wait_for(
            lambda: daemon.stats.requests_dead_lettered + daemon.stats.requests_error >= 1,
            timeout=10,
            message="the empty request refused",
        )


class _CancelledOnceApp(RecordingApp):
    """The first apply of a request setting ``/cancel_once`` ends in a cancellation from inside the app's step."""

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        updates = getattr(request.updates, "updates", ())
        if (
            any(getattr(u, "path", None) == "/cancel_once" for u in updates)
            and not self.attempts[str(request.id)]
        ):
            self.attempts[str(request.id)] += 1
            raise asyncio.CancelledError
        return await super().apply(change_set, state, request)


async def test_a_request_cut_short_by_a_cancellation_is_not_overtaken(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """A cancellation escaping a request's handling (not the consumer's close) must not let the requests queued
    behind it go first: the task is retried, and the next activation applies all of them in order."""
    settings, app = fast_settings(subject_prefix), _CancelledOnceApp()
    async with running_daemon(nc, settings, app) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        ids = [await client.enqueue_updates(wk, cs, [SetLiteral(path="/cancel_once", value=True)])]
        ids += await _enqueue(client, wk, cs, 3, "behind")
        await _all_applied(daemon, wk, cs, ids)
        assert app.attempts[str(ids[0])] == 2
        assert daemon.stats.tasks_retried >= 1
