"""The orphan sweep (``rebaser_server/daemon/sweeper.py`` and ``junk.py``), one sweep at a time, no daemon: a queued
request without a task gets one, in its own shard; junk on malformed subjects is dead-lettered (requests) or dropped
(tasks) and deleted, and a junk subject that reads as a wildcard never touches a real request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_core import headers as h
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.layout import Layout
from rebaser_core.nats.requester import Requester
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.nats.tasks import publish_task
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.changeset.context import Nats, Placement, Stats
from rebaser_server.changeset.replies import Replies
from rebaser_server.daemon.sweeper import Sweeper
from rebaser_server.ops.observe import Observer
from rebaser_server.record.direct_reads import DirectReads
from rebaser_server.testing import fast_settings


@dataclass
class Sweep:
    nc: NatsClient
    settings: Settings
    sweeper: Sweeper
    stats: Stats

    async def queue(self, subjects: Subjects, wk: WorkspacePk, cs: ChangeSetId) -> int:
        return (await self.nc.jetstream().publish(subjects.requests(wk, cs), b"request")).seq

    async def tasked(self, subjects: Subjects, wk: WorkspacePk, cs: ChangeSetId) -> int:
        subject = subjects.task(wk, cs)
        info = await self.nc.jetstream().stream_info(subjects.tasks_stream, subjects_filter=subject)
        return (info.state.subjects or {}).get(subject, 0)

    async def stored(self, stream: str, subject: str) -> int:
        info = await self.nc.jetstream().stream_info(stream, subjects_filter=subject)
        return (info.state.subjects or {}).get(subject, 0)


async def _sweep(nc: NatsClient, settings: Settings, layout: Layout, requester: Requester) -> Sweep:
    stats = Stats()
    js = nc.jetstream()
    nats = Nats(nc, js, requester, DirectReads(requester, settings.nats_timeout))
    replies = Replies(nc, settings, settings.subjects, stats, Observer())
    return Sweep(nc, settings, Sweeper(nats, settings, Placement(layout=layout), replies), stats)


@pytest.fixture
async def requester(nc: NatsClient) -> AsyncIterator[Requester]:
    requester = Requester(nc)
    yield requester
    await requester.close()


@pytest.fixture
async def sweep(nc: NatsClient, subject_prefix: str, requester: Requester) -> Sweep:
    settings = fast_settings(subject_prefix)
    await ensure_streams(nc.jetstream(), settings, consumer=False)
    return await _sweep(nc, settings, Layout(), requester)


async def test_a_request_without_a_task_gets_one_once(sweep: Sweep) -> None:
    subjects = sweep.settings.subjects
    orphan = (WorkspacePk.new(), ChangeSetId.new())
    served = (WorkspacePk.new(), ChangeSetId.new())
    await sweep.queue(subjects, *orphan)
    await sweep.queue(subjects, *orphan)
    await sweep.queue(subjects, *served)
    assert await publish_task(sweep.nc, subjects.task(*served))  # has its task already
    assert await sweep.sweeper.sweep_once() == 1
    assert await sweep.tasked(subjects, *orphan) == 1 and await sweep.tasked(subjects, *served) == 1
    # Swept again: every queued change set has its task now.
    assert await sweep.sweeper.sweep_once() == 0
    assert await sweep.tasked(subjects, *orphan) == 1
    assert (sweep.sweeper.sweeps, sweep.sweeper.orphans_found) == (2, 1)
    # Nothing queued, nothing to do; the requests themselves are left alone.
    assert await sweep.stored(subjects.requests_stream, subjects.requests(*orphan)) == 2


async def test_an_empty_deployment_sweeps_to_nothing(sweep: Sweep) -> None:
    assert await sweep.sweeper.sweep_once() == 0
    assert sweep.sweeper.junk.removed == 0 and sweep.stats.requests_dead_lettered == 0


async def test_junk_requests_are_dead_lettered_and_deleted_and_junk_tasks_dropped(sweep: Sweep) -> None:
    settings, subjects, js = sweep.settings, sweep.settings.subjects, sweep.nc.jetstream()
    p = settings.prefix
    real = (WorkspacePk.new(), ChangeSetId.new())
    real_seq = await sweep.queue(subjects, *real)
    # Two tokens, so the requests stream's filter takes them, but no change set: nobody will ever consume them.
    # "*" is a literal token here; used as a filter it would match the real request above.
    junk_requests = [
        f"{p}.rebaser.requests.notaulid.{ChangeSetId.new()}",
        f"{p}.rebaser.requests.*.{real[1]}",
        f"{p}.rebaser.requests.{str(WorkspacePk.new()).lower()}.{str(ChangeSetId.new()).lower()}",
    ]
    junk_seqs = {}
    for subject in junk_requests:
        junk_seqs[subject] = (await js.publish(subject, b"junk", headers={"X-Source": "test"})).seq
    junk_task = f"{p}.rebaser.tasks.notaulid.{ChangeSetId.new()}.process"
    await js.publish(junk_task, b"")

    assert await sweep.sweeper.sweep_once() == 1  # the real request, which had no task either
    assert sweep.sweeper.junk.removed == len(junk_requests) + 1
    for subject in junk_requests:
        assert await sweep.stored(subjects.requests_stream, subject) == 0, subject
    assert await sweep.stored(subjects.tasks_stream, junk_task) == 0
    # The real request is still there, with its task.
    assert (await js.get_last_msg(subjects.requests_stream, subjects.requests(*real))).seq == real_seq
    assert await sweep.tasked(subjects, *real) == 1
    # Every junk request, and only those, copied to the malformed dead letters with the reason.
    info = await js.stream_info(subjects.dead_letter_stream, subjects_filter=subjects.dead_letters_all)
    assert info.state.messages == len(junk_requests)
    assert sweep.stats.requests_dead_lettered == len(junk_requests)
    seen = {}
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        letter = await js.get_msg(subjects.dead_letter_stream, seq)
        assert letter.subject == subjects.dead_letter_malformed
        assert letter.headers is not None and letter.data == b"junk" and letter.headers["X-Source"] == "test"
        assert letter.headers[h.DEAD_LETTER_REASON].startswith("malformed subject: ")
        seen[letter.headers[h.DEAD_LETTER_SUBJECT]] = int(letter.headers[h.DEAD_LETTER_SEQUENCE])
    assert seen == junk_seqs
    # Swept again: nothing left to remove.
    assert await sweep.sweeper.sweep_once() == 0
    assert sweep.sweeper.junk.removed == len(junk_requests) + 1


async def test_every_shard_is_swept_and_each_orphan_gets_its_task_in_its_own_shard(
    nc: NatsClient, subject_prefix: str, requester: Requester
) -> None:
    settings = fast_settings(subject_prefix)
    await ensure_streams(nc.jetstream(), settings, consumer=False, shards=range(2), streams=2)
    sweep = await _sweep(nc, settings, Layout(streams=2), requester)
    shard0, shard1 = settings.subjects.for_shard(0), settings.subjects.for_shard(1)
    a = (WorkspacePk.new(), ChangeSetId.new())
    b = (WorkspacePk.new(), ChangeSetId.new())
    await sweep.queue(shard0, *a)
    await sweep.queue(shard1, *b)
    assert await sweep.sweeper.sweep_once() == 2
    assert await sweep.tasked(shard0, *a) == 1 and await sweep.tasked(shard1, *b) == 1
    assert await sweep.tasked(shard0, *b) == 0 and await sweep.tasked(shard1, *a) == 0


async def test_a_shard_that_cannot_be_swept_does_not_stop_the_others(
    nc: NatsClient, subject_prefix: str, requester: Requester
) -> None:
    settings = fast_settings(subject_prefix)
    # Shard 1's streams do not exist (its leader being elected, say): its sweep fails.
    await ensure_streams(nc.jetstream(), settings, consumer=False)
    sweep = await _sweep(nc, settings, Layout(streams=2), requester)
    orphan = (WorkspacePk.new(), ChangeSetId.new())
    await sweep.queue(settings.subjects, *orphan)
    with pytest.raises(Exception):  # noqa: B017 (whatever JetStream answers for a missing stream)
        await sweep.sweeper.sweep_once()
    assert await sweep.tasked(settings.subjects, *orphan) == 1
    assert sweep.sweeper.sweeps == 1 and sweep.sweeper.orphans_found == 1
