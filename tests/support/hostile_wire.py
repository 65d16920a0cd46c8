"""Raw NATS helpers for the hostile-input tests: publish hand-made requests and read what became of them."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_core import headers as h
from rebaser_core.api import ENQUEUE_UPDATES_RESPONSE, EnqueueUpdatesResponse
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.tasks import publish_task
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for

REQUEST_HEADERS = {
    h.MESSAGE_TYPE: "EnqueueUpdatesRequest",
    h.MESSAGE_VERSION: "3",
    h.CONTENT_TYPE: "application/cbor",
}


async def publish_raw(
    nc: NatsClient, settings: Settings, wk: WorkspacePk, cs: ChangeSetId, headers: dict[str, str], body: bytes
) -> int:
    """Store a hand-made request and give its change set a task; return its sequence."""
    ack = await nc.jetstream().publish(settings.subjects.requests(wk, cs), body, headers=headers)
    await publish_task(nc, settings.subjects.task(wk, cs))
    return ack.seq


async def raw_call(
    nc: NatsClient, settings: Settings, wk: WorkspacePk, cs: ChangeSetId, headers: dict[str, str], body: bytes
) -> EnqueueUpdatesResponse:
    """Publish a hand-made request with a fresh reply inbox and await its reply."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, max_msgs=1)
    await publish_raw(nc, settings, wk, cs, {**headers, h.REPLY_INBOX: inbox}, body)
    reply = await sub.next_msg(timeout=20)
    return ENQUEUE_UPDATES_RESPONSE.decode(reply.headers, reply.data)


async def dead_letter_of(nc: NatsClient, settings: Settings, wk: WorkspacePk, cs: ChangeSetId) -> Msg:
    """The last dead letter of a change set (waits for it)."""
    js = nc.jetstream()

    async def get() -> Msg:
        return await js.get_last_msg(
            settings.subjects.dead_letter_stream, settings.subjects.dead_letter(wk, cs)
        )  # type: ignore[return-value]

    return await wait_for(get, timeout=20, message="a dead letter", retry_on=(Exception,))


async def stream_empty(nc: NatsClient, stream: str) -> bool:
    return (await nc.jetstream().stream_info(stream)).state.messages == 0
