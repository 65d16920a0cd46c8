"""An owned change set's ordered consumer answers JetStream's flow control, without a polling task.

nats-py's ordered consumer runs a task per consumer that wakes four times a second to send put-off flow-control
replies; the daemon's own consumer (``consumer.py``) answers a request when the deliveries before it are handled.
A backlog big enough to make the server ask for flow control must drain, with no polling task, and a slow change
set must hold the server to its window.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.integration.changeset.test_request_consumer import bound_consumer
from tests.support.apps import GatedApp, RecordingApp

_REQUESTS = 48
_VALUE = "x" * 400_000  # 48 x 400 kB: past the bytes the server lets a push consumer have outstanding


def _polling_tasks() -> list[asyncio.Task[object]]:
    """nats-py's flow-control polling tasks of request consumers. The daemon's one watch of the pauses bucket (a
    nats-py KV watch, one per daemon whatever it owns) has its own, and is not one of them."""
    return [
        t
        for t in asyncio.all_tasks()
        if "check_flow_control_response" in repr(t.get_coro()) and not _watches_a_bucket(t)
    ]


def _watches_a_bucket(task: asyncio.Task[object]) -> bool:
    frame = getattr(task.get_coro(), "cr_frame", None)
    jsi = None if frame is None else frame.f_locals.get("self")
    stream = getattr(jsi, "_stream", "")
    return isinstance(stream, str) and stream.startswith("KV_")


async def test_a_backlog_that_needs_flow_control_drains_without_the_polling_task(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, quiescent_period=30.0)
    await ensure_streams(nc.jetstream(), settings)  # the backlog is queued before any daemon runs
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    for i in range(_REQUESTS):
        await client.enqueue_updates(
            wk, cs, [SetLiteral(path="/big", value=_VALUE), SetLiteral(path="/i", value=i)]
        )
    replies: list[str] = []

    async def on_flow_control_reply(msg: Msg) -> None:
        replies.append(msg.subject)

    watch = await nc.subscribe("$JS.FC.>", cb=on_flow_control_reply)
    try:
        async with running_daemon(nc, settings, RecordingApp()) as daemon:
            await wait_for(
                lambda: daemon.stats.requests_applied >= _REQUESTS,
                timeout=60,
                message="the backlog applied",
            )
            assert daemon.keeper.watching == 1  # still owned, its consumer still bound
            assert _polling_tasks() == []
        assert replies, "the server never asked for flow control: the backlog was too small to test it"
    finally:
        await watch.unsubscribe()


async def test_a_slow_change_set_holds_the_servers_flow_control_until_its_queue_is_handled(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """The server stops sending once its flow-control request is unanswered; the daemon answers it only when the
    deliveries before it are handled, so a change set whose app is slow buffers the server's window, not the
    whole backlog. The server's own word that it stopped: an idle heartbeat naming the held request as stalled."""
    settings = fast_settings(
        subject_prefix, quiescent_period=30.0, handler_deadline=60.0, consumer_heartbeat=0.5
    )
    await ensure_streams(nc.jetstream(), settings)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    await client.enqueue_updates(wk, cs, [SetLiteral(path="/gate", value=True)])
    for i in range(_REQUESTS):
        await client.enqueue_updates(
            wk, cs, [SetLiteral(path="/big", value=_VALUE), SetLiteral(path="/i", value=i)]
        )
    app = GatedApp()
    async with running_daemon(nc, settings, app) as daemon:
        await wait_for(lambda: app.held == 1, timeout=10, message="the first request in the app")
        consumer = await bound_consumer(daemon)
        stalled: list[str] = []

        async def on_inbox(
            msg: Msg,
        ) -> None:  # a second subscriber on the consumer's inbox: it sees what the daemon sees
            name = (msg.headers or {}).get("Nats-Consumer-Stalled")
            if name and consumer._flow.holds(name):
                stalled.append(name)

        listener = await nc.subscribe(consumer.inbox, cb=on_inbox)
        try:
            await wait_for(
                lambda: stalled, timeout=30, message="the server stalled on the held flow-control request"
            )
        finally:
            await listener.unsubscribe()
        assert consumer._flow.received < _REQUESTS + 1, "the whole backlog was sent: nothing to hold"
        app.gate.set()
        await wait_for(
            lambda: daemon.stats.requests_applied >= _REQUESTS + 1,
            timeout=60,
            message="the backlog applied",
        )
