"""Letting a change set go (``rebaser_server/changeset/release.py``), called directly on a real task delivery: a
fenced owner touches nothing; a release acks, then gives a queued request a task; an unconfirmed ack or a failing
check still ends the release. (The race itself, a request published inside the release window through a daemon,
is ``test_quiescence_race.py``; a check that fails once, ``test_stranding.py``.)"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.requester import Requester
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.nats.tasks import publish_task
from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.context import Nats, Report, Stats
from rebaser_server.changeset.outcome import Outcome
from rebaser_server.changeset.release import release
from rebaser_server.ops.observe import Observer
from rebaser_server.record.direct_reads import DirectReads
from rebaser_server.record.handle import ChangeSetHandle
from rebaser_server.record.store import ChangeSetStore, TaskDelivery
from rebaser_server.task.lease import Lease
from rebaser_server.testing import RecordingHooks, fast_settings


@dataclass
class Taken:
    """A change set whose task was pulled from the tasks consumer and whose record this owner wrote."""

    nc: NatsClient
    settings: Settings
    change_set: ChangeSet
    store: ChangeSetStore
    handle: ChangeSetHandle
    task: Msg
    since: float
    nats: Nats
    hooks: RecordingHooks
    stats: Stats

    def lease(self, *, since: float | None = None) -> Lease:
        return Lease(
            self.nc,
            self.task,
            ack_wait=self.settings.ack_wait,
            margin=0.1,
            since=self.since if since is None else since,
        )

    async def release(self, lease: Lease | None = None, nats: Nats | None = None) -> Any:
        return await release(
            self.change_set,
            self.handle,
            lease or self.lease(),
            self.settings.subjects,
            nats=nats or self.nats,
            settings=self.settings,
            report=Report(self.stats, Observer(), self.hooks),
        )

    async def tasks(self) -> list[int]:
        """Stream sequences of the change set's task messages still in the tasks stream."""
        cs, subjects = self.change_set, self.settings.subjects
        subject = subjects.task(cs.workspace_id, cs.change_set_id)
        js = self.nc.jetstream()
        info = await js.stream_info(subjects.tasks_stream, subjects_filter=subject)
        if not (info.state.subjects or {}).get(subject):
            return []
        last = await js.get_last_msg(subjects.tasks_stream, subject)
        return [last.seq or 0]

    async def queue_request(self) -> None:
        cs = self.change_set
        subject = self.settings.subjects.requests(cs.workspace_id, cs.change_set_id)
        await self.nc.jetstream().publish(subject, b"left in the stream")


async def _taken(nc: NatsClient, subject_prefix: str, **overrides: Any) -> tuple[Taken, Requester]:
    settings = fast_settings(subject_prefix, **overrides)
    js = nc.jetstream()
    await ensure_streams(js, settings)
    subjects = settings.subjects
    cs = ChangeSet(WorkspacePk.new(), ChangeSetId.new())
    assert await publish_task(nc, subjects.task(cs.workspace_id, cs.change_set_id))
    puller = await js.pull_subscribe_bind(subjects.tasks_consumer, subjects.tasks_stream)
    since = time.monotonic()
    (task,) = await puller.fetch(1, timeout=5)
    requester = Requester(nc)
    store = ChangeSetStore(js, settings, requester)
    await store.open()
    handle = (await store.acquire(cs, "owner", {"n": 0}, TaskDelivery.of(task))).handle
    await handle.commit(handle.record)
    taken = Taken(
        nc,
        settings,
        cs,
        store,
        handle,
        task,
        since,
        Nats(nc, js, requester, DirectReads(requester, settings.nats_timeout)),
        RecordingHooks(),
        Stats(),
    )
    return taken, requester


@pytest.fixture
async def taken(nc: NatsClient, subject_prefix: str) -> AsyncIterator[Taken]:
    taken, requester = await _taken(nc, subject_prefix)
    try:
        yield taken
    finally:
        await requester.close()


async def test_a_quiet_change_set_is_let_go_its_task_acked(taken: Taken) -> None:
    (task_seq,) = await taken.tasks()
    result = await taken.release()
    assert result.outcome is Outcome.RELEASED
    assert [name for name, _ in taken.hooks.events] == ["stopped_consuming", "task_acked"]
    assert await taken.tasks() == []  # acked: gone from the work queue, and no new one
    assert task_seq > 0 and taken.stats.release_checks_failed == 0


async def test_a_request_still_queued_gets_a_new_task_after_the_ack(taken: Taken) -> None:
    (old,) = await taken.tasks()
    await taken.queue_request()  # queued while the old task still exists: its own task publish was refused
    assert not await publish_task(
        taken.nc,
        taken.settings.subjects.task(taken.change_set.workspace_id, taken.change_set.change_set_id),
    )
    result = await taken.release()
    assert result.outcome is Outcome.RELEASED
    (new,) = await taken.tasks()
    assert new > old  # the old one acked, a new one published for the request


async def test_a_fenced_owner_returns_without_acking(taken: Taken) -> None:
    # Another daemon took the change set over (its epoch bumped with compare-and-set): its task is its own now.
    other = await taken.store.acquire(
        taken.change_set,
        "other",
        {"n": 0},
        TaskDelivery(taken.handle.record.task_seq, taken.handle.record.task_delivery + 1),
    )
    assert other.handle.record.epoch == taken.handle.record.epoch + 1
    tasks = await taken.tasks()
    result = await taken.release()
    assert result.outcome is Outcome.FENCED
    assert taken.hooks.events == []  # it stopped before the release began
    assert await taken.tasks() == tasks  # not acked
    info = await taken.nc.jetstream().consumer_info(
        taken.settings.subjects.tasks_stream, taken.settings.subjects.tasks_consumer
    )
    assert info.num_ack_pending == 1
    record = await taken.store.read(taken.change_set)
    assert record is not None and record.owner == "other"


async def test_a_release_without_the_lease_acks_nothing_but_still_checks_for_requests(taken: Taken) -> None:
    tasks = await taken.tasks()
    await taken.queue_request()
    # A lease that ran out (a pause past ack_wait): the ack is not sent; the task stays for whoever holds it.
    lost = taken.lease(since=time.monotonic() - 2 * taken.settings.ack_wait)
    assert not lost.held()
    result = await taken.release(lost)
    assert result.outcome is Outcome.RELEASED
    assert [name for name, _ in taken.hooks.events] == ["stopped_consuming", "task_acked"]
    assert await taken.tasks() == tasks  # still there (a second task publish is refused while it exists)


async def test_a_queued_check_that_keeps_failing_is_counted_and_left_to_the_sweep(
    nc: NatsClient, subject_prefix: str
) -> None:
    taken, requester = await _taken(nc, subject_prefix, nats_timeout=0.3)
    try:
        calls = 0

        class Failing(Nats):
            async def queued(self, change_set: ChangeSet, **kwargs: Any) -> bool:
                nonlocal calls
                calls += 1
                raise TimeoutError("injected: no answer")

        failing = Failing(taken.nats.nc, taken.nats.js, taken.nats.requester, taken.nats.reads)
        result = await taken.release(nats=failing)
        assert result.outcome is Outcome.RELEASED
        assert calls >= 1
        assert taken.stats.release_checks_failed == 1
        assert await taken.tasks() == []  # the ack itself went through
    finally:
        await requester.close()
