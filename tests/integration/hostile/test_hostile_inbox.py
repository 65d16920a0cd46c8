"""A reply inbox is a publish target chosen by the caller: the daemon publishes only to valid inboxes."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core import headers as h
from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    ENQUEUE_UPDATES_RESPONSE,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    ErrorStatus,
    InlineUpdates,
)
from rebaser_core.errors import ProtocolError, RebaserRefused
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp, applied
from tests.support.hostile_wire import dead_letter_of, publish_raw


def _request(wk: WorkspacePk, cs: ChangeSetId, inbox: str) -> tuple[RequestId, dict[str, str], bytes]:
    request = EnqueueUpdatesRequest(
        id=RequestId.new(),
        workspace_id=wk,
        change_set_id=cs,
        updates=InlineUpdates(updates=[SetLiteral(path="/n", value=1)]),
    )
    headers, body = ENQUEUE_UPDATES_REQUEST.encode(request, reply_inbox=inbox)
    return request.id, headers, body


async def test_hostile_inboxes_are_dead_lettered_and_never_published_to(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    subjects = settings.subjects
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        victim_wk, victim_cs = WorkspacePk.new(), ChangeSetId.new()
        assert (
            await client.enqueue_updates_with_reply(
                victim_wk, victim_cs, [SetLiteral(path="/n", value=1)], timeout=20
            )
        ).ok
        kv = daemon.store.kv
        key = subjects.change_set_key(victim_wk, victim_cs)
        before = await kv.get(key)
        hostile = [
            f"$KV.{subjects.change_sets_bucket}.{key}",
            f"$O.{subjects.snapshots_bucket}.M.abc",
            subjects.requests(victim_wk, victim_cs),
            "_INBOX."
            + "x" * 5000,  # over nats-server's control-line limit: would cost the daemon its connection
            "_INBOX.a.>",
            "x.y",
        ]
        # Anything published where the inboxes point (except the over-long one: no subscription takes it) lands here.
        seen: list[str] = []

        async def spy(msg: object) -> None:
            seen.append(msg.subject)  # type: ignore[attr-defined]

        spies = [
            await nc.subscribe(target, cb=spy)
            for target in hostile
            if len(target) < 200 and "*" not in target and ">" not in target
        ]
        wk = WorkspacePk.new()
        for inbox in hostile:
            cs = ChangeSetId.new()
            _rid, headers, body = _request(wk, cs, inbox)
            await publish_raw(nc, settings, wk, cs, headers, body)
            letter = await dead_letter_of(nc, settings, wk, cs)
            assert letter.headers is not None
            assert "InvalidReplyInbox" in letter.headers[h.DEAD_LETTER_REASON], letter.headers
            assert await applied(daemon.store, wk, cs) == []
        # The daemon kept its connection and still serves; nothing was written where the inboxes pointed.
        assert nc.is_connected and daemon.nats.nc.is_connected
        assert (
            await client.enqueue_updates_with_reply(
                wk, ChangeSetId.new(), [SetLiteral(path="/n", value=2)], timeout=20
            )
        ).ok
        after = await kv.get(key)
        assert after.revision == before.revision and after.value == before.value
        assert (await daemon.store.read(ChangeSet(victim_wk, victim_cs))) is not None
        await nc.flush()
        for sub in spies:
            await sub.unsubscribe()
        assert seen == []


async def test_query_with_a_hostile_reply_subject_is_not_answered(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        assert (
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        ).ok
        key = settings.subjects.change_set_key(wk, cs)
        before = await daemon.store.kv.get(key)
        from rebaser_core.api import GET_CHANGE_SET_REQUEST, GetChangeSetRequest

        headers, body = GET_CHANGE_SET_REQUEST.encode(
            GetChangeSetRequest(id=RequestId.new(), workspace_id=wk, change_set_id=cs)
        )
        target = f"$KV.{settings.subjects.change_sets_bucket}.{key}"
        await nc.publish(settings.subjects.api("get", wk, cs), body, reply=target, headers=headers)
        # A query with a proper inbox, sent after it, is answered: the hostile one was handled (and dropped) first.
        with pytest.raises(RebaserRefused, match="cannot describe"):  # answered (RecordingApp has no views)
            await client.get_change_set(wk, cs)
        after = await daemon.store.kv.get(key)
        assert after.revision == before.revision


async def _stored_request(
    nc: NatsClient, settings: Settings, wk: WorkspacePk, cs: ChangeSetId
) -> tuple[str, str]:
    js = nc.jetstream()

    async def stored() -> object:
        return await js.get_last_msg(settings.subjects.requests_stream, settings.subjects.requests(wk, cs))

    msg = await wait_for(stored, retry_on=(Exception,), message="request stored")
    inbox = msg.headers[h.REPLY_INBOX]  # type: ignore[attr-defined]
    return inbox, inbox.rsplit(".", 1)[-1]


@pytest.mark.parametrize("forge", ["id", "workspace_id", "change_set_id"])
async def test_client_refuses_a_reply_for_another_request(
    nc: NatsClient, subject_prefix: str, forge: str
) -> None:
    settings = fast_settings(subject_prefix)
    await ensure_streams(nc.jetstream(), settings, consumer=False)
    async with RebaserClient(nc, prefix=subject_prefix) as client:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        call = asyncio.create_task(
            client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        )
        inbox, rid = await _stored_request(nc, settings, wk, cs)
        fields = {"id": RequestId(rid), "workspace_id": wk, "change_set_id": cs}
        fields[forge] = {
            "id": RequestId.new(),
            "workspace_id": WorkspacePk.new(),
            "change_set_id": ChangeSetId.new(),
        }[forge]
        forged = EnqueueUpdatesResponse(**fields, status=ErrorStatus(message="forged", retryable=False))  # type: ignore[arg-type]
        headers, body = ENQUEUE_UPDATES_RESPONSE.encode(forged)
        await nc.publish(inbox, body, headers=headers)
        with pytest.raises(ProtocolError, match=forge):
            await call
