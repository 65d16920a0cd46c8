"""A request publish that never reaches the server (written to a connection that then dropped) is sent again while
its caller waits, under the same ``Nats-Msg-Id``: stored once, answered once; and sent again ever less often while it
stays unanswered (a busy server is not sent a large request every 2 s)."""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral, _publisher
from rebaser_core.errors import RebaserUnavailable
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


async def test_an_unanswered_request_is_sent_again_ever_less_often(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Scaled down: the first resend after 50 ms, the pauses doubling up to 400 ms. Every publish of the request is
    # lost, so it is never answered and its caller gives up after its publish_timeout (2 s).
    monkeypatch.setattr(_publisher, "_RESEND_AFTER", 0.05)
    monkeypatch.setattr(_publisher, "_RESEND_MAX", 0.4)
    settings = fast_settings(subject_prefix)
    client = RebaserClient(nc, prefix=subject_prefix, publish_timeout=2.0)
    publish = NatsClient.publish
    sends: list[str] = []
    pauses: list[float] = []

    async def lose_every_request(self: NatsClient, subject: str, payload: bytes = b"", **kwargs: Any) -> None:
        if ".rebaser.requests." in subject:
            sends.append(subject)  # never reaches the server, and nothing says so
            return
        await publish(self, subject, payload, **kwargs)

    monkeypatch.setattr(NatsClient, "publish", lose_every_request)
    client._publisher.on_resend = lambda subject, pause: pauses.append(pause)
    async with running_daemon(nc, settings, RecordingApp()):
        with pytest.raises(RebaserUnavailable):
            await client.enqueue_updates(
                WorkspacePk.new(), ChangeSetId.new(), [SetLiteral(path="/n", value=1)]
            )

    assert len(set(sends)) == 1 and len(sends) == len(pauses) + 1  # the first send, then each resend told
    assert len(pauses) >= 3
    # The pause before each resend doubles from the first (each within its jitter), up to the cap.
    jitter = _publisher._RESEND_JITTER
    for i, pause in enumerate(pauses):
        wanted = min(0.05 * 2**i, 0.4)
        assert wanted * (1 - jitter) <= pause <= wanted * (1 + jitter), (i, pauses)
    # In the caller's 2 s: at most 8 resends even at the shortest jitter (without the backoff, about 40).
    assert len(pauses) <= 8
