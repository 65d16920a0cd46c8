"""Dead letters are bounded, and dead-lettering always ends the request, even when the copy cannot be stored."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient
from nats.js import api as js_api

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core import headers as h
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.streams import dead_letter_stream_config, ensure_streams
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.hostile_wire import REQUEST_HEADERS, dead_letter_of, raw_call, stream_empty


def _garbled(**extra: str) -> dict[str, str]:
    return {**REQUEST_HEADERS, h.NATS_MSG_ID: str(RequestId.new()), **extra}


async def test_oversized_header_block_is_refused_and_its_dead_letter_stored(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        # Near JetStream's 64 KiB header limit: stored in the requests stream, but a full copy plus the
        # dead-letter headers would be refused (err 10097): the request must end all the same.
        reply = await raw_call(nc, settings, wk, cs, _garbled(**{"X-Junk": "a" * 65_000}), b"\xff")
        assert reply.status.kind == "error" and "HeadersTooLarge" in reply.status.message
        letter = await dead_letter_of(nc, settings, wk, cs)
        assert letter.headers is not None
        assert letter.headers[h.DEAD_LETTER_HEADERS_DROPPED] == "1" and "X-Junk" not in letter.headers
        assert (
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        ).ok
        await wait_for(
            lambda: stream_empty(nc, settings.subjects.requests_stream), message="requests stream empty"
        )
        assert daemon.stats.dead_letter_failures == 0


async def test_request_ends_when_its_dead_letter_cannot_be_stored(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        await nc.jetstream().delete_stream(settings.subjects.dead_letter_stream)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        reply = await raw_call(nc, settings, wk, cs, _garbled(), b"\xff\x00garbage")
        assert reply.status.kind == "error" and "DecodeError" in reply.status.message
        assert daemon.stats.dead_letter_failures == 1 and daemon.stats.requests_dead_lettered == 0
        assert (
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        ).ok
        await wait_for(
            lambda: stream_empty(nc, settings.subjects.requests_stream), message="requests stream empty"
        )


async def test_dead_letters_are_bounded_copies_in_a_bounded_stream(
    nc: NatsClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, dead_letter_max_body=1024, dead_letter_max_msgs=3)
    async with running_daemon(nc, settings, RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        body = b"\xff" + b"x" * 200_000
        for _ in range(5):
            reply = await raw_call(nc, settings, wk, cs, _garbled(), body)
            assert reply.status.kind == "error"
        letter = await dead_letter_of(nc, settings, wk, cs)
        assert letter.headers is not None and letter.headers[h.DEAD_LETTER_TRUNCATED] == str(len(body))
        assert letter.data == body[:1024]
        info = await nc.jetstream().stream_info(settings.subjects.dead_letter_stream)
        assert info.state.messages == 3  # the oldest two were dropped
        assert info.config.max_msgs == 3 and info.config.max_bytes == settings.dead_letter_max_bytes


async def test_an_existing_dead_letter_stream_gets_the_limits(nc: NatsClient, subject_prefix: str) -> None:
    # The production size (fast_settings shrinks it to spare the test server's memory).
    settings = fast_settings(subject_prefix, dead_letter_max_bytes=Settings().dead_letter_max_bytes)
    js = nc.jetstream()
    unbounded = dead_letter_stream_config(settings)
    unbounded.max_bytes, unbounded.max_msgs = -1, -1
    await js.add_stream(unbounded)
    await ensure_streams(js, settings, consumer=False)
    config = (await js.stream_info(settings.subjects.dead_letter_stream)).config
    assert (config.max_bytes, config.max_msgs) == (256 * 1024 * 1024, 100_000)
    assert config.discard == js_api.DiscardPolicy.OLD
