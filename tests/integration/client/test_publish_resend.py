"""A request publish that never reaches the server (written to a connection that then dropped) is sent again while
its caller waits, under the same ``Nats-Msg-Id``: stored once, answered once."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp


async def test_a_request_publish_lost_on_the_way_is_sent_again(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found after a server restart in CI: a request published just after the reconnect got no acknowledgement, and its
    # caller gave up after its 10 s with RebaserUnavailable although the server was up all along.
    settings = fast_settings(subject_prefix)
    client = RebaserClient(nc, prefix=subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    publish = NatsClient.publish
    lost: list[str] = []

    async def lose_the_first_request(
        self: NatsClient, subject: str, payload: bytes = b"", **kwargs: Any
    ) -> None:
        if ".rebaser.requests." in subject and not lost:
            lost.append(subject)  # never reaches the server, and nothing says so
            return
        await publish(self, subject, payload, **kwargs)

    monkeypatch.setattr(NatsClient, "publish", lose_the_first_request)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        reply = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=10)
        assert reply.ok, reply
        assert lost
        assert daemon.stats.requests_applied == 1
        info = await nc.jetstream().stream_info(settings.subjects.requests_stream)
        assert info.state.last_seq == 1  # stored once
