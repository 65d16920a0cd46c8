"""Junk subjects: refused by the streams' subject filters where NATS can, removed by the sweep where it cannot,
and a task with nothing to do never creates a change-set record."""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import api as js_api
from nats.js.errors import NoStreamResponseError

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core import headers as h
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.streams import dead_letter_stream_config, requests_stream_config, tasks_stream_config
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.hostile_wire import REQUEST_HEADERS


async def test_junk_in_streams_from_older_versions_is_removed(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, sweep_interval=0.2)
    subjects, js = settings.subjects, nc.jetstream()
    # Streams as older versions created them: any number of tokens after "rebaser.requests" / "rebaser.tasks".
    for config, everything in (
        (requests_stream_config(settings), subjects.requests_all),
        (tasks_stream_config(settings), subjects.tasks_all),
        (dead_letter_stream_config(settings), subjects.dead_letters_all),
    ):
        config.subjects = [everything]
        await js.add_stream(config)
    p = subject_prefix
    junk_requests = [
        f"{p}.rebaser.requests.A.B.C",
        f"{p}.rebaser.requests.{'x' * 3000}.y",
        f"{p}.rebaser.requests.notaulid.{ChangeSetId.new()}",
        f"{p}.rebaser.requests.*.*",
        f"{p}.rebaser.requests.>",
        f"{p}.rebaser.requests.{str(WorkspacePk.new()).lower()}.{str(ChangeSetId.new()).lower()}",
    ]
    junk_tasks = [f"{p}.rebaser.tasks.a.b.c.d", f"{p}.rebaser.tasks.x", f"{p}.rebaser.tasks.*.*.*"]
    headers = {**REQUEST_HEADERS, h.NATS_MSG_ID: str(RequestId.new())}
    for subject in junk_requests:
        await js.publish(subject, b"junk", headers={**headers, h.NATS_MSG_ID: str(RequestId.new())})
    for subject in junk_tasks:
        await js.publish(subject, b"")
    # A real request waits among them (no task yet): junk subjects used as filters would match it.
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    real = await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=1)])

    async with running_daemon(nc, settings, RecordingApp()) as daemon:

        async def clean() -> bool:
            requests = await js.stream_info(subjects.requests_stream, subjects_filter=subjects.requests_all)
            tasks = await js.stream_info(subjects.tasks_stream, subjects_filter=subjects.tasks_all)
            return not requests.state.subjects and not tasks.state.subjects

        await wait_for(clean, timeout=20, message="junk removed and the real request applied")
        record = await daemon.store.read(ChangeSet(wk, cs))
        assert record is not None and record.state["applied"] == [str(real)]
        dlq = await js.stream_info(
            subjects.dead_letter_stream, subjects_filter=subjects.dead_letter_malformed
        )
        assert dlq.state.messages == len(junk_requests)
        letter = await js.get_last_msg(subjects.dead_letter_stream, subjects.dead_letter_malformed)
        assert letter.headers is not None and "malformed subject" in letter.headers[h.DEAD_LETTER_REASON]
        # The streams now take only well-shaped subjects.
        info = await js.stream_info(subjects.requests_stream)
        assert info.config.subjects == [subjects.requests_stream_subject]
        for subject in (junk_requests[0], junk_tasks[0]):
            with pytest.raises(NoStreamResponseError):
                await js.publish(subject, b"junk", timeout=2)


@pytest.mark.parametrize("intake", ["fifo", "fair", "lanes"])
async def test_tasks_with_nothing_to_do_create_no_record(
    nc: NatsClient, subject_prefix: str, intake: str
) -> None:
    # fifo and lanes: the task is taken, and let go once its change set is found with no record and no request;
    # fair: its workspace is found with no request and no consumer, and its tasks are dropped untaken (newcomers.py).
    settings = fast_settings(subject_prefix, intake=intake)
    subjects, js = settings.subjects, nc.jetstream()
    # nats-server announces every consumer made on the requests stream, in order.
    created: list[Msg] = []

    async def announced(msg: Msg) -> None:
        created.append(msg)

    advisories = await nc.subscribe(
        f"$JS.EVENT.ADVISORY.CONSUMER.CREATED.{subjects.requests_stream}.*", cb=announced
    )
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        await js.publish(subjects.task(wk, cs), b"")  # a well-formed task, but no request was ever queued
        await js.publish(f"{subject_prefix}.rebaser.tasks.notaulid.{ChangeSetId.new()}.process", b"")
        await js.publish(f"{subject_prefix}.rebaser.tasks.{str(wk).lower()}.{str(cs).lower()}.process", b"")

        async def tasks_gone() -> bool:
            return (await js.stream_info(subjects.tasks_stream)).state.messages == 0

        # (fair: a task stored just after a discovery read the stream waits for the next, 10 s later: a deadline past
        # it, as a fresh-clone CI run under load needed once.)
        await wait_for(tasks_gone, timeout=30, message="every task removed")
        if intake in ("fifo", "lanes"):
            assert daemon.stats.tasks_dropped == 1
        else:
            assert daemon.stats.tasks_dropped == 0 and daemon.intake_status()["empty_tasks_dropped"] == 1
        assert await daemon.store.read(ChangeSet(wk, cs)) is None
        records = await js.stream_info(subjects.records_stream, subjects_filter=subjects.records_all)
        assert not records.state.subjects  # no record written, as the server counts them
        # No consumer either: a real request's is the first one nats-server announces.
        reply = await RebaserClient(nc, prefix=subject_prefix).enqueue_updates_with_reply(
            wk, ChangeSetId.new(), [SetLiteral(path="/a", value=1)], timeout=10
        )
        assert reply.ok
        await wait_for(lambda: created, timeout=10, message="the real request's consumer announced")
        assert len(created) == 1
    await advisories.unsubscribe()


async def test_task_subjects_must_end_in_process(nc: NatsClient, subject_prefix: str) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()):
        info = await nc.jetstream().stream_info(settings.subjects.tasks_stream)
        assert info.config.subjects == [settings.subjects.tasks_stream_subject]
        assert info.config.retention == js_api.RetentionPolicy.WORK_QUEUE
