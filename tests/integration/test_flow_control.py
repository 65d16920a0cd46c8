"""An owned change set's ordered consumer answers JetStream's flow control without nats-py's polling task.

nats-py runs, per ordered consumer, a task that wakes four times a second to send put-off flow-control replies;
with a callback subscription it never has one to send, so the daemon stops it (``consumer.py``). A backlog big
enough to make the server ask for flow control must still drain, and no polling task may run meanwhile.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.streams import ensure_streams
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.apps import RecordingApp

_REQUESTS = 48
_VALUE = "x" * 400_000  # 48 x 400 kB: past the bytes the server lets a push consumer have outstanding


def _polling_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if "check_flow_control_response" in repr(t.get_coro())]


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
                lambda: daemon.rt.stats.requests_applied >= _REQUESTS,
                timeout=60,
                message="the backlog applied",
            )
            assert daemon.rt.keeper.watching == 1  # still owned, its consumer still bound
            assert _polling_tasks() == []
        assert replies, "the server never asked for flow control: the backlog was too small to test it"
    finally:
        await watch.unsubscribe()


async def test_a_put_off_reply_is_sent_at_once_and_the_task_is_stopped(nc: NatsClient) -> None:
    """Should nats-py ever put a flow-control reply off (it does not for callback subscriptions today), it goes out
    at once instead of waiting for the stopped task."""
    from types import SimpleNamespace

    from rebaser_server.consumer import _no_flow_control_polling

    answered: list[str] = []

    async def on_reply(msg: Msg) -> None:
        answered.append(msg.subject)

    sub = await nc.subscribe("fc.test.reply", cb=on_reply)
    polling = asyncio.create_task(asyncio.Event().wait())
    jsi = SimpleNamespace(_fctask=polling, schedule_flow_control_response=lambda reply: None)
    try:
        _no_flow_control_polling(SimpleNamespace(nc=nc), SimpleNamespace(_sub=SimpleNamespace(_jsi=jsi)))  # type: ignore[arg-type]
        assert jsi._fctask is None
        await asyncio.wait({polling}, timeout=5)
        assert polling.cancelled()
        jsi.schedule_flow_control_response("fc.test.reply")
        await wait_for(lambda: answered == ["fc.test.reply"], timeout=5, message="the reply sent")
    finally:
        polling.cancel()
        await sub.unsubscribe()
