"""Replies and dead letters (``rebaser_server/changeset/replies.py``) against a real nats-server: a reply goes to
a checked inbox in the caller's content type; a dead letter is a bounded copy with the reason, stored once, and a
copy no stream will take is given up and counted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from rebaser_core import headers as h
from rebaser_core.api import ENQUEUE_UPDATES_RESPONSE, EnqueueUpdatesResponse, SuccessStatus
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.streams import dead_letter_stream_config, ensure_streams
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.changeset.context import Stats
from rebaser_server.changeset.replies import Replies
from rebaser_server.ops.observe import Observer
from rebaser_server.testing import fast_settings


@dataclass
class Setup:
    settings: Settings
    replies: Replies
    stats: Stats
    inbox_prefix: str  # this test's inboxes: under the deployment's reply inbox prefix


@pytest.fixture
async def setup(nc: NatsClient, subject_prefix: str) -> AsyncIterator[Setup]:
    inbox_prefix = f"_INBOX.{subject_prefix}."
    settings = fast_settings(subject_prefix, reply_inbox_prefix=inbox_prefix, dead_letter_max_body=64)
    await ensure_streams(nc.jetstream(), settings, consumer=False)
    stats = Stats()
    yield Setup(settings, Replies(nc, settings, settings.subjects, stats, Observer()), stats, inbox_prefix)


def _response() -> EnqueueUpdatesResponse:
    return EnqueueUpdatesResponse(
        id=RequestId.new(),
        workspace_id=WorkspacePk.new(),
        change_set_id=ChangeSetId.new(),
        status=SuccessStatus(updates_performed=3),
    )


async def _reply_to(nc: NatsClient, replies: Replies, headers: dict[str, str], inbox: str) -> Msg:
    sub = await nc.subscribe(inbox, max_msgs=1)
    response = _response()
    await replies.send({**headers, h.REPLY_INBOX: inbox}, response)
    msg = await sub.next_msg(timeout=5)
    assert ENQUEUE_UPDATES_RESPONSE.decode(msg.headers, msg.data) == response
    return msg


# -- replies ----------------------------------------------------------------------------------------------------


async def test_a_reply_is_cbor_unless_the_caller_wrote_json(nc: NatsClient, setup: Setup) -> None:
    cases = [
        ({}, "application/cbor"),  # no content type: the default
        ({h.CONTENT_TYPE: "application/cbor"}, "application/cbor"),
        ({h.CONTENT_TYPE: "application/json"}, "application/json"),
        ({"x-content-type": "Application/JSON; charset=utf-8"}, "application/json"),  # any case, parameters
        ({h.CONTENT_TYPE: "text/plain"}, "application/json"),  # unusable: the readable fallback
    ]
    for i, (headers, expected) in enumerate(cases):
        msg = await _reply_to(nc, setup.replies, headers, f"{setup.inbox_prefix}ct{i}")
        assert msg.headers is not None and msg.headers[h.CONTENT_TYPE] == expected, headers
        if expected == "application/json":
            assert msg.data.startswith(b"{")


async def test_no_reply_without_an_inbox_or_to_one_the_daemon_may_not_publish_to(
    nc: NatsClient, setup: Setup
) -> None:
    received: list[str] = []

    async def record(msg: Msg) -> None:
        received.append(msg.subject)

    everything: Subscription = await nc.subscribe(f"{setup.inbox_prefix}>", cb=record)
    try:
        replies, prefix = setup.replies, setup.inbox_prefix
        await replies.send({}, _response())  # asks for no reply
        await replies.send({h.REPLY_INBOX: ""}, _response())
        await replies.send({h.REPLY_INBOX: f"{prefix}ignored"}, _response(), None)  # checked: none wanted
        await replies.send({h.REPLY_INBOX: prefix + "x" * 300}, _response())  # too long: unsafe
        # Two inboxes in two letter cases: ambiguous, so neither is answered.
        await replies.send(
            {h.REPLY_INBOX: f"{prefix}one", h.REPLY_INBOX.lower(): f"{prefix}two"}, _response()
        )
        # An inbox the caller checked already is used as given, whatever the header says.
        await replies.send({h.REPLY_INBOX: f"{prefix}header"}, _response(), f"{prefix}checked")
        await replies.send({h.REPLY_INBOX: f"{prefix}last"}, _response())
        # One connection's publishes reach one subscription in order: once "last" is in, nothing else came.
        await wait_for(lambda: f"{prefix}last" in received, timeout=5, message="the last reply")
        assert received == [f"{prefix}checked", f"{prefix}last"]
    finally:
        await everything.unsubscribe()


# -- dead letters -----------------------------------------------------------------------------------------------


async def test_a_dead_letter_is_a_copy_with_the_reason_and_is_stored_once(
    nc: NatsClient, setup: Setup
) -> None:
    subjects, js = setup.settings.subjects, nc.jetstream()
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    subject = subjects.requests(wk, cs)
    original = {
        h.CONTENT_TYPE: "application/cbor",
        h.NATS_MSG_ID: "the-callers-id",  # JetStream's own headers are not copied
        "Nats-Expected-Stream": "X",
        "X-Trace": "abc",
    }
    reason = "DecodeError: bad\nbody \u00e9"  # one ASCII line in the header
    assert await setup.replies.dead_letter_stored(subject, original, b"body", 41, reason)
    letter = await js.get_last_msg(subjects.dead_letter_stream, subjects.dead_letter(wk, cs))
    assert letter.data == b"body"
    assert letter.headers is not None
    assert letter.headers[h.DEAD_LETTER_REASON] == "DecodeError: bad body \\xe9"
    assert letter.headers[h.DEAD_LETTER_SUBJECT] == subject
    assert letter.headers[h.DEAD_LETTER_SEQUENCE] == "41"
    assert letter.headers[h.CONTENT_TYPE] == "application/cbor" and letter.headers["X-Trace"] == "abc"
    assert "Nats-Expected-Stream" not in letter.headers
    assert letter.headers[h.NATS_MSG_ID] == f"{subjects.requests_stream}:41"  # deduplicated by sequence
    assert h.DEAD_LETTER_TRUNCATED not in letter.headers
    assert setup.stats.requests_dead_lettered == 1
    # Dead-lettered again (its delete failed, the next owner copied it again): still one copy.
    assert await setup.replies.dead_letter_stored(subject, original, b"body", 41, reason)
    info = await js.stream_info(subjects.dead_letter_stream, subjects_filter=subjects.dead_letter(wk, cs))
    assert info.state.messages == 1
    assert setup.stats.dead_letter_failures == 0


async def test_an_oversized_body_is_cut_and_its_length_noted(nc: NatsClient, setup: Setup) -> None:
    subjects = setup.settings.subjects
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    body = bytes(range(256)) * 4
    assert await setup.replies.dead_letter_stored(subjects.requests(wk, cs), None, body, 7, "too big")
    letter = await nc.jetstream().get_last_msg(subjects.dead_letter_stream, subjects.dead_letter(wk, cs))
    assert letter.data == body[:64]
    assert letter.headers is not None and letter.headers[h.DEAD_LETTER_TRUNCATED] == str(len(body))


async def test_a_request_on_a_malformed_subject_is_filed_as_malformed(nc: NatsClient, setup: Setup) -> None:
    subjects = setup.settings.subjects
    junk = f"{setup.settings.prefix}.rebaser.requests.notaulid.{ChangeSetId.new()}"
    assert await setup.replies.dead_letter_stored(junk, {}, b"junk", 3, "malformed subject: x")
    letter = await nc.jetstream().get_last_msg(subjects.dead_letter_stream, subjects.dead_letter_malformed)
    assert letter.data == b"junk"
    assert letter.headers is not None and letter.headers[h.DEAD_LETTER_SUBJECT] == junk


async def test_a_copy_the_stream_refuses_is_stored_without_headers_and_body(
    nc: NatsClient, setup: Setup
) -> None:
    settings, subjects, js = setup.settings, setup.settings.subjects, nc.jetstream()
    small = dead_letter_stream_config(settings)
    small.max_msg_size = 1024  # the full copy (its headers) is refused: err "message size exceeds maximum"
    await js.update_stream(small)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    headers = {f"X-Big-{i}": "v" * 500 for i in range(4)}
    assert await setup.replies.dead_letter_stored(subjects.requests(wk, cs), headers, b"b" * 60, 9, "refused")
    letter = await js.get_last_msg(subjects.dead_letter_stream, subjects.dead_letter(wk, cs))
    assert letter.data in (b"", None)
    assert letter.headers is not None
    assert letter.headers[h.DEAD_LETTER_TRUNCATED] == "60" and letter.headers[h.DEAD_LETTER_SEQUENCE] == "9"
    assert not any(name.startswith("X-Big-") for name in letter.headers)
    assert setup.stats.requests_dead_lettered == 1 and setup.stats.dead_letter_failures == 0


async def test_a_copy_no_stream_stores_is_given_up_and_counted(nc: NatsClient, setup: Setup) -> None:
    subjects = setup.settings.subjects
    await nc.jetstream().delete_stream(subjects.dead_letter_stream)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    stored = await setup.replies.dead_letter_stored(subjects.requests(wk, cs), {}, b"x", 5, "gone")
    assert stored is False
    assert setup.stats.dead_letter_failures == 1 and setup.stats.requests_dead_lettered == 0
