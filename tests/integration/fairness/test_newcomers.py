"""The fair intake's newcomers (rebaser_server.intake.newcomers) against a real nats-server: a workspace with only
made-up tasks gets no consumer and no turn, and its tasks go; a request stored while its workspace is found empty
is still served, without the orphan sweep, also when the read after the purge fails."""

from __future__ import annotations

import nats.errors
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.testing import wait_for
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.intake.fair_intake import FairIntake
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp, applied


async def _intake(daemon: Daemon) -> FairIntake:
    await wait_for(lambda: daemon.intakes.of(0) is not None, timeout=10, message="the fair intake runs")
    intake = daemon.intakes.of(0)
    assert intake is not None
    return intake


async def test_made_up_workspaces_get_no_consumer_and_their_tasks_go(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, intake="fair")
    subjects, js = settings.subjects, nc.jetstream()
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        intake = await _intake(daemon)
        made_up = [WorkspacePk.new() for _ in range(50)]
        for wk in made_up:
            for _ in range(3):
                await js.publish(subjects.task(wk, ChangeSetId.new()), b"")
        real = WorkspacePk.new()
        reply = await client.enqueue_updates_with_reply(
            real, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=20
        )
        assert reply.ok, reply

        # Both: the last workspace's check ends just after its tasks are counted dropped (seen once in CI).
        await wait_for(
            lambda: (
                intake.newcomers.empty_tasks_dropped == 150
                and daemon.intake_status()["workspaces_checking"] == 0
            ),
            timeout=20,
            message="every made-up task dropped and no workspace still being checked",
        )
        consumers = [c.name async for c in _consumers(nc, subjects.tasks_stream)]
        assert consumers == [subjects.workspace_tasks_consumer(real)]
        assert daemon.stats.tasks_dropped == 0  # none was ever taken: no record read for any of them
        status = daemon.intake_status()
        assert status["empty_tasks_dropped"] == 150 and status["workspaces_checking"] == 0


async def _consumers(nc: NatsClient, stream: str):  # type: ignore[no-untyped-def]
    for info in await nc.jetstream().consumers_info(stream):
        yield info


async def test_a_request_stored_while_its_workspace_is_found_empty_is_served(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # The orphan sweep is out of reach: only the newcomer check's second look can give the request its task.
    settings = fast_settings(subject_prefix, intake="fair", sweep_interval=3600.0)
    subjects, js = settings.subjects, nc.jetstream()
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    sent: list[str] = []
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        intake = await _intake(daemon)
        newcomers = intake.newcomers
        consumer_exists = newcomers._consumer_exists

        async def with_a_request_stored_meanwhile(workspace: WorkspacePk) -> bool:
            # Between the check for requests (none yet) and the purge: the client stores its request, and its task
            # is refused as a duplicate of the made-up one, which the purge then removes.
            if workspace == wk and not sent:
                sent.append(str(await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=1)])))
            return await consumer_exists(workspace)

        newcomers._consumer_exists = with_a_request_stored_meanwhile  # type: ignore[method-assign]
        await js.publish(subjects.task(wk, cs), b"")  # made up: no request behind it (yet)

        async def served() -> bool:
            return await applied(daemon.store, wk, cs) == sent

        await wait_for(lambda: sent, timeout=10, message="the request stored during the check")
        await wait_for(served, timeout=15, message="the request applied")
        assert newcomers.empty_tasks_dropped == 1


async def test_a_request_whose_task_was_purged_gets_it_again_when_the_read_after_the_purge_fails(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # As above, and the look for a request stored during the check, the read after the purge, is lost once (a
    # timeout, as in a leader election). The orphan sweep is out of reach: only the newcomer check, looking again,
    # can give the request its task back.
    settings = fast_settings(subject_prefix, intake="fair", sweep_interval=3600.0)
    subjects, js = settings.subjects, nc.jetstream()
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    sent: list[str] = []
    reads_failed: list[WorkspacePk] = []
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        intake = await _intake(daemon)
        newcomers = intake.newcomers
        consumer_exists, queued = newcomers._consumer_exists, newcomers._queued
        purge_next = False

        async def with_a_request_stored_meanwhile(workspace: WorkspacePk) -> bool:
            nonlocal purge_next
            if workspace != wk or sent:
                return await consumer_exists(workspace)
            # Between the check for requests (none yet) and the purge: the client stores its request, and its task
            # is refused as a duplicate of the made-up one, which the purge then removes.
            sent.append(str(await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=1)])))
            exists = await consumer_exists(workspace)
            purge_next = not exists
            return exists

        async def the_read_after_the_purge_failing(workspace: WorkspacePk) -> bool:
            nonlocal purge_next
            if workspace == wk and purge_next:
                purge_next = False
                reads_failed.append(workspace)
                raise nats.errors.TimeoutError
            return await queued(workspace)

        newcomers._consumer_exists = with_a_request_stored_meanwhile  # type: ignore[method-assign]
        newcomers._queued = the_read_after_the_purge_failing  # type: ignore[method-assign]
        await js.publish(subjects.task(wk, cs), b"")  # made up: no request behind it (yet)

        async def served() -> bool:
            return await applied(daemon.store, wk, cs) == sent

        await wait_for(lambda: reads_failed, timeout=10, message="the read after the purge failed")
        await wait_for(served, timeout=15, message="the request applied")
        assert reads_failed == [wk]
        assert newcomers.empty_tasks_dropped == 1
        # Its task came back from the newcomer check, not from the orphan sweep.
        assert newcomers.tasks_given_back == 1
        assert daemon.sweeper.orphans_found == 0


async def test_many_workspaces_found_at_start_are_checked_together(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # Found in the stream at start, all at once: more than are read one by one, so one read of the requests
    # stream's subjects tells which have work.
    settings = fast_settings(subject_prefix, intake="fair")
    subjects, js = settings.subjects, nc.jetstream()
    await ensure_streams(js, settings, consumer=False)
    for _ in range(60):
        await js.publish(subjects.task(WorkspacePk.new(), ChangeSetId.new()), b"")
    real, cs = WorkspacePk.new(), ChangeSetId.new()
    sent = str(await client.enqueue_updates(real, cs, [SetLiteral(path="/n", value=1)]))
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        intake = await _intake(daemon)

        async def served() -> bool:
            return await applied(daemon.store, real, cs) == [sent]

        await wait_for(served, timeout=15, message="the real workspace's request applied")
        await wait_for(
            lambda: intake.newcomers.empty_tasks_dropped == 60,
            timeout=15,
            message="every made-up task dropped",
        )
        consumers = [c.name async for c in _consumers(nc, subjects.tasks_stream)]
        assert consumers == [subjects.workspace_tasks_consumer(real)]
        assert intake.newcomers.batches_read >= 1


async def test_a_task_stored_after_the_check_read_the_stream_is_still_dropped(
    nc: NatsClient, subject_prefix: str
) -> None:
    # The daemon hears a task's publish as the stream does: its check may read the tasks stream's last sequence
    # before the task is stored, and the purge then stops short of it. Here the first read is made to come first.
    # The next discovery (10 s) is out of reach of the wait: only a check given again can drop the task.
    settings = fast_settings(subject_prefix, intake="fair")
    subjects, js = settings.subjects, nc.jetstream()
    wk = WorkspacePk.new()
    early: list[int] = []
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        intake = await _intake(daemon)
        newcomers = intake.newcomers
        last_task_seq = newcomers._last_task_seq

        async def read_before_the_task_is_stored() -> int:
            seq = await last_task_seq()
            if early:
                return seq
            early.append(seq)
            return seq - 1

        newcomers._last_task_seq = read_before_the_task_is_stored  # type: ignore[method-assign]
        await js.publish(subjects.task(wk, ChangeSetId.new()), b"")  # made up: no request behind it

        async def tasks_gone() -> bool:
            return (await js.stream_info(subjects.tasks_stream)).state.messages == 0

        await wait_for(tasks_gone, timeout=5, message="the made-up task dropped")
        assert early and newcomers.empty_tasks_dropped == 1 and newcomers.rechecks >= 1
        assert daemon.stats.tasks_dropped == 0
