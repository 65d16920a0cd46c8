"""A CBOR bomb (shared references, ~260 bytes, 2**40 nodes once expanded) against a live daemon and client."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core import headers as h
from rebaser_core.api import GET_CHANGE_SET_RESPONSE
from rebaser_core.errors import DecodeError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp, applied
from tests.support.hostile import request_bomb
from tests.support.hostile_wire import REQUEST_HEADERS, dead_letter_of, raw_call, stream_empty


async def test_bomb_request_is_dead_lettered_and_the_canary_is_served(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs, canary = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
        rid = RequestId.new()
        body = request_bomb(40, str(rid), str(wk), str(cs))
        assert len(body) < 400
        bomb_reply = asyncio.create_task(
            raw_call(nc, settings, wk, cs, {**REQUEST_HEADERS, h.NATS_MSG_ID: str(rid)}, body)
        )
        served = await client.enqueue_updates_with_reply(
            wk, canary, [SetLiteral(path="/n", value=1)], timeout=20
        )
        assert served.ok
        reply = await bomb_reply
        assert reply.id == rid and reply.status.kind == "error" and "DecodeError" in reply.status.message
        letter = await dead_letter_of(nc, settings, wk, cs)
        assert letter.headers is not None and "tag 28" in letter.headers[h.DEAD_LETTER_REASON]
        assert await applied(daemon.store, wk, cs) == []
        await wait_for(
            lambda: stream_empty(nc, settings.subjects.requests_stream), message="requests stream empty"
        )


async def test_bomb_query_is_answered_with_an_error(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        body = request_bomb(40, str(RequestId.new()), str(wk), str(cs))
        headers = {
            h.MESSAGE_TYPE: "GetChangeSetRequest",
            h.MESSAGE_VERSION: "1",
            h.CONTENT_TYPE: "application/cbor",
        }
        reply = await nc.request(settings.subjects.api("get", wk, cs), body, headers=headers, timeout=10)
        response = GET_CHANGE_SET_RESPONSE.decode(reply.headers, reply.data)
        assert response.error is not None and "DecodeError" in response.error
        assert (await client.get_change_set(wk, cs)).exists is False  # and it still answers real queries


async def test_bomb_reply_is_a_decode_error_at_the_client(nc: NatsClient, subject_prefix: str) -> None:
    # No daemon: a rogue answers in its place, on the client's own reply inbox.
    settings = fast_settings(subject_prefix)
    async with RebaserClient(nc, prefix=subject_prefix) as client:
        from rebaser_core.nats.streams import ensure_streams

        await ensure_streams(nc.jetstream(), settings, consumer=False)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        call = asyncio.create_task(
            client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        )
        js = nc.jetstream()

        async def stored() -> object:
            return await js.get_last_msg(
                settings.subjects.requests_stream, settings.subjects.requests(wk, cs)
            )

        from rebaser_core.testing import wait_for

        request = await wait_for(stored, retry_on=(Exception,), message="request stored")
        inbox = request.headers[h.REPLY_INBOX]  # type: ignore[attr-defined]
        rid = inbox.rsplit(".", 1)[-1]
        body = request_bomb(40, rid, str(wk), str(cs))
        headers = {
            h.MESSAGE_TYPE: "EnqueueUpdatesResponse",
            h.MESSAGE_VERSION: "1",
            h.CONTENT_TYPE: "application/cbor",
        }
        await nc.publish(inbox, body, headers=headers)
        with pytest.raises(DecodeError, match="tag 28"):
            await call
