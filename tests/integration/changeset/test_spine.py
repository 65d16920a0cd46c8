"""The spine against a real nats-server: ordering, exclusivity, replies, dead letters, retries, quiescence."""

from __future__ import annotations

import asyncio
import logging

import nats
import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core import headers as h
from rebaser_core.api import ENQUEUE_UPDATES_REQUEST, ENQUEUE_UPDATES_RESPONSE, ContentType
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp, applied


def noop(n: int = 0) -> list[SetLiteral]:
    return [SetLiteral(path="/n", value=n)]


async def test_request_reply_roundtrip(nc: NatsClient, client: RebaserClient, subject_prefix: str) -> None:
    app = RecordingApp()
    async with running_daemon(nc, fast_settings(subject_prefix), app) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        response = await client.enqueue_updates_with_reply(wk, cs, noop(), timeout=10)
        assert response.ok and response.workspace_id == wk and response.change_set_id == cs
        assert await applied(daemon.store, wk, cs) == [str(response.id)]


async def test_json_client_gets_json_reply(nc: NatsClient, subject_prefix: str) -> None:
    async with (
        running_daemon(nc, fast_settings(subject_prefix), RecordingApp()),
        RebaserClient(nc, prefix=subject_prefix, content_type=ContentType.JSON) as client,
    ):
        response = await client.enqueue_updates_with_reply(
            WorkspacePk.new(), ChangeSetId.new(), noop(), timeout=10
        )
        assert response.ok


async def test_order_and_exclusivity_with_three_daemons(nats_url: str, subject_prefix: str) -> None:
    # Short quiet period: change sets are released and re-taken by other daemons while requests keep coming.
    settings = fast_settings(subject_prefix, quiescent_period=0.05)
    app = RecordingApp()  # shared by the three in-process daemons: it sees any overlap on a change set
    conns = [await nats.connect(nats_url) for _ in range(4)]
    try:
        async with (
            running_daemon(conns[0], settings, app) as d0,
            running_daemon(conns[1], settings, app),
            running_daemon(conns[2], settings, app),
            RebaserClient(conns[3], prefix=subject_prefix) as client,
        ):
            wk = WorkspacePk.new()
            change_sets = [ChangeSetId.new() for _ in range(12)]
            sent: dict[ChangeSetId, list[str]] = {cs: [] for cs in change_sets}

            async def produce(cs: ChangeSetId) -> None:
                for i in range(15):
                    sent[cs].append(str(await client.enqueue_updates(wk, cs, noop(i))))
                    if i % 5 == 4:
                        await asyncio.sleep(0.08)  # a gap longer than the quiet period: the owner may change

            await asyncio.gather(*(produce(cs) for cs in change_sets))
            for cs in change_sets:
                await wait_for(
                    lambda cs=cs: applied(d0.store, wk, cs),  # type: ignore[misc]
                    timeout=30,
                    message=f"requests of {cs} applied",
                )

                async def complete(cs: ChangeSetId = cs) -> bool:
                    return len(await applied(d0.store, wk, cs)) == len(sent[cs])

                await wait_for(complete, timeout=30, message=f"all requests of {cs} applied")
                assert await applied(d0.store, wk, cs) == sent[cs]
            assert app.overlaps == []
    finally:
        for conn in conns:
            await conn.close()


async def test_quiescence_releases_task_and_consumer(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        js = nc.jetstream()
        baseline = (await js.stream_info(settings.subjects.requests_stream)).state.consumer_count
        wk = WorkspacePk.new()
        await asyncio.gather(
            *(client.enqueue_updates_with_reply(wk, ChangeSetId.new(), noop()) for _ in range(5))
        )
        await wait_for(lambda: not daemon.owned, timeout=10, message="all change sets released")

        async def back_to_baseline() -> bool:
            requests = await js.stream_info(settings.subjects.requests_stream)
            tasks = await js.stream_info(settings.subjects.tasks_stream)
            return (
                requests.state.consumer_count == baseline
                and tasks.state.messages == 0
                and (requests.state.messages == 0)
            )

        await wait_for(back_to_baseline, timeout=10, message="consumers, tasks and requests back to baseline")
        assert daemon.stats.tasks_released == 5


async def test_poison_request_is_dead_lettered_and_next_one_processed(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        poison = asyncio.create_task(
            client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/poison", value=1)])
        )
        good = asyncio.create_task(client.enqueue_updates_with_reply(wk, cs, noop()))
        bad, ok = await poison, await good
        assert bad.status.kind == "error" and "poison" in bad.status.message and not bad.status.retryable
        assert ok.ok
        assert await applied(daemon.store, wk, cs) == [str(ok.id)]
        dlq = await nc.jetstream().get_last_msg(
            settings.subjects.dead_letter_stream, settings.subjects.dead_letter(wk, cs)
        )
        assert dlq.headers is not None and "poison" in dlq.headers[h.DEAD_LETTER_REASON]
        assert ENQUEUE_UPDATES_REQUEST.decode(dlq.headers, dlq.data).id == bad.id
        # Where the app raised it: in the reply, the reason, and the dead letter's trace (code, never data).
        assert "(at apps.py:" in bad.status.message and "in apply)" in bad.status.message
        assert dlq.headers[h.DEAD_LETTER_TRACE].endswith("in apply")


async def _raw_request(nc: NatsClient, subject: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
    """Publish a hand-made request (plus its task) and return the reply's headers; the reply is awaited."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, max_msgs=1)
    await nc.request(subject, body, headers={**headers, h.REPLY_INBOX: inbox})
    reply = await sub.next_msg(timeout=10)
    return {
        "status": ENQUEUE_UPDATES_RESPONSE.decode(reply.headers, reply.data).status.kind,
        "message": getattr(ENQUEUE_UPDATES_RESPONSE.decode(reply.headers, reply.data).status, "message", ""),
    }


async def test_garbled_and_unsupported_requests_get_error_replies(
    nc: NatsClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    subjects = settings.subjects
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        subject = subjects.requests(wk, cs)
        base = {
            h.MESSAGE_TYPE: "EnqueueUpdatesRequest",
            h.MESSAGE_VERSION: "3",
            h.CONTENT_TYPE: "application/cbor",
        }
        cases = [
            ({**base, h.NATS_MSG_ID: str(RequestId.new())}, b"\xff\x00garbage", "DecodeError"),
            (
                {**base, h.NATS_MSG_ID: str(RequestId.new()), h.MESSAGE_VERSION: "9"},
                b"",
                "UnsupportedMessageVersion",
            ),
            (
                {**base, h.NATS_MSG_ID: str(RequestId.new()), h.CONTENT_TYPE: "text/xml"},
                b"<x/>",
                "UnsupportedContentType",
            ),
        ]
        from rebaser_core.nats.tasks import publish_task

        for headers, body, expected in cases:
            reply_task = asyncio.create_task(_raw_request(nc, subject, headers, body))
            await asyncio.sleep(0)
            await publish_task(nc, subjects.task(wk, cs))
            reply = await reply_task
            assert reply["status"] == "error" and expected in reply["message"], reply
        assert daemon.stats.requests_dead_lettered == 3
        info = await nc.jetstream().stream_info(subjects.dead_letter_stream)
        assert info.state.messages == 3


async def test_retryable_failure_still_reaches_caller(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        response = await client.enqueue_updates_with_reply(
            wk, cs, [SetLiteral(path="/flaky", value=2)], timeout=20
        )
        assert response.ok
        assert daemon.stats.requests_retried == 2 and daemon.stats.tasks_retried == 2


async def test_an_app_s_failed_attempt_is_logged_once_at_warning_with_its_traceback(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rebaser_server.changeset.app_failures")
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        response = await client.enqueue_updates_with_reply(
            wk, cs, [SetLiteral(path="/flaky", value=1)], timeout=20
        )
        assert response.ok
    failures = [r for r in caplog.records if r.name == "rebaser_server.changeset.app_failures"]
    assert len(failures) == 1, [r.getMessage() for r in failures]  # one failed attempt, said once
    assert failures[0].levelno == logging.WARNING
    assert "attempt 1 of 5 (will retry): RetryableError: flaky attempt 1" in failures[0].getMessage()
    assert failures[0].exc_info is not None  # where in the app: the traceback ends in its file
    assert "tests/support/apps.py" in caplog.text


async def test_request_over_max_attempts_is_dead_lettered(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix, max_attempts=3), RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        failing = asyncio.create_task(
            client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/flaky", value=99)], timeout=20)
        )
        following = asyncio.create_task(client.enqueue_updates_with_reply(wk, cs, noop(), timeout=20))
        bad = await failing
        assert bad.status.kind == "error" and "gave up after 3 attempts" in bad.status.message
        assert (await following).ok
        assert daemon.stats.requests_dead_lettered == 1


async def test_wedged_request_is_given_up_and_dead_lettered(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, handler_deadline=0.3, progress_period=0.1, max_attempts=2)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        hung = asyncio.create_task(
            client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/hang", value=1)], timeout=20)
        )
        after = asyncio.create_task(client.enqueue_updates_with_reply(wk, cs, noop(), timeout=20))
        bad = await hung
        assert bad.status.kind == "error"
        assert (await after).ok
        assert daemon.stats.tasks_wedged >= 1


async def test_redelivered_request_is_not_applied_twice(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    from rebaser_server.changeset.hooks import Hooks

    class FailAfterCommitOnce(Hooks):
        failed = False

        async def checkpoint(self, name: str, change_set: ChangeSet) -> None:
            if name == "applied" and not self.failed:
                self.failed = True
                raise RuntimeError("crash between commit and delete")

    async with running_daemon(
        nc, fast_settings(subject_prefix), RecordingApp(), hooks=FailAfterCommitOnce()
    ) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        response = await client.enqueue_updates_with_reply(wk, cs, noop(), timeout=20)
        assert response.ok
        assert await applied(daemon.store, wk, cs) == [str(response.id)]
        assert daemon.stats.requests_replayed == 1


async def test_orphaned_request_is_found_by_the_sweep(nc: NatsClient, subject_prefix: str) -> None:
    settings = fast_settings(subject_prefix, sweep_interval=0.3)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        from rebaser_core.api import EnqueueUpdatesRequest, InlineUpdates

        request = EnqueueUpdatesRequest(
            id=RequestId.new(), workspace_id=wk, change_set_id=cs, updates=InlineUpdates(updates=noop())
        )
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, max_msgs=1)
        headers, body = ENQUEUE_UPDATES_REQUEST.encode(request, reply_inbox=inbox)
        await nc.jetstream().publish(
            settings.subjects.requests(wk, cs), body, headers=headers
        )  # no task: a client crash
        reply = await sub.next_msg(timeout=10)
        assert ENQUEUE_UPDATES_RESPONSE.decode(reply.headers, reply.data).ok
        assert daemon.sweeper.orphans_found >= 1
