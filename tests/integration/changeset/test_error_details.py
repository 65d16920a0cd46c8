"""An error the app's code caused is answered with its details (reply version 3): the exception's class and where
in the app it was raised. A caller that does not say it reads version 3 (``X-Reply-Version``) gets the reply as
before, without them; the message says where either way."""

from __future__ import annotations

import asyncio

import cbor2
import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core import headers as h
from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    ENQUEUE_UPDATES_RESPONSE,
    ContentType,
    EnqueueUpdatesRequest,
    ErrorStatus,
    InlineUpdates,
)
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.tasks import publish_task
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp


async def test_a_client_gets_the_class_and_place_of_the_app_s_error(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        bad = await client.enqueue_updates_with_reply(
            wk, cs, [SetLiteral(path="/poison", value=1)], timeout=20
        )
    status = bad.status
    assert isinstance(status, ErrorStatus) and status.details is not None
    assert status.details.error_class == "UnprocessableError"
    assert status.details.raised_at is not None
    assert status.details.raised_at.startswith("apps.py:") and status.details.raised_at.endswith("in apply")
    assert f"(at {status.details.raised_at})" in status.message


@pytest.mark.parametrize(("reads", "version"), [(None, "1"), ("2", "1"), ("3", "3"), ("junk", "1")])
async def test_the_details_go_only_to_a_caller_that_reads_version_3(
    nc: NatsClient, subject_prefix: str, reads: str | None, version: str
) -> None:
    settings = fast_settings(subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    request = EnqueueUpdatesRequest(
        id=RequestId.new(),
        workspace_id=wk,
        change_set_id=cs,
        updates=InlineUpdates(updates=[SetLiteral(path="/poison", value=1)]),
    )
    inbox = nc.new_inbox()
    headers, body = ENQUEUE_UPDATES_REQUEST.encode(request, ContentType.CBOR, reply_inbox=inbox)
    if reads is not None:
        headers[h.REPLY_VERSION] = reads
    async with running_daemon(nc, settings, RecordingApp()):
        sub = await nc.subscribe(inbox, max_msgs=1)
        await nc.jetstream().publish(settings.subjects.requests(wk, cs), body, headers=headers)
        await publish_task(nc, settings.subjects.task(wk, cs))
        reply = await asyncio.wait_for(sub.next_msg(timeout=20), 25)
    assert reply.headers is not None and reply.headers[h.MESSAGE_VERSION] == version
    raw = cbor2.loads(reply.data)["status"]
    assert raw["kind"] == "error" and "(at apps.py:" in raw["message"]
    assert ("details" in raw) == (version == "3")
    decoded = ENQUEUE_UPDATES_RESPONSE.decode(reply.headers, reply.data).status
    assert isinstance(decoded, ErrorStatus) and (decoded.details is not None) == (version == "3")
