"""Removing processed requests: a few by sequence, more by one purge; gone is done; a failed removal is retried."""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.context import Placement
from rebaser_server.changeset.hooks import Hooks
from rebaser_server.changeset.trimmer import Trimmer, purges
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp


class Removals(Hooks):
    def __init__(self) -> None:
        self.failing = False
        self.removals = 0

    async def checkpoint(self, name: str, change_set: ChangeSet) -> None:
        if name == "purging":
            self.removals += 1
        if name == "purging" and self.failing:
            raise RuntimeError("removal refused (injected fault)")


async def _stored(nc: NatsClient, stream: str, subject: str) -> set[int]:
    """Sequences of the messages on ``subject`` still in ``stream``."""
    js = nc.jetstream()
    info = await js.stream_info(stream, subjects_filter=subject)
    if not (info.state.subjects or {}).get(subject):
        return set()
    sub = await js.subscribe(subject, stream=stream, ordered_consumer=True)
    seqs: set[int] = set()
    try:
        while len(seqs) < info.state.subjects[subject]:
            msg = await sub.next_msg(timeout=5)
            seqs.add(msg.metadata.sequence.stream)
    finally:
        await sub.unsubscribe()
    return seqs


def _trimmer(daemon: Daemon, settings: Settings, change_set: ChangeSet) -> Trimmer:
    """A trimmer of ``change_set`` on the running daemon's connection (no task: only it removes)."""
    return Trimmer(
        change_set,
        settings.subjects,
        requester=daemon.nats.requester,
        settings=settings,
        report=daemon.report,
        placement=Placement(),
    )


# The two stores answer a delete of a message already gone differently (see trimmer._gone).
@pytest.mark.parametrize("storage", ["memory", "file"])
async def test_removal_by_sequence_by_purge_and_after_a_failure(
    nc: NatsClient, subject_prefix: str, storage: str
) -> None:
    settings = fast_settings(subject_prefix, idempotency_window=64, storage=storage)
    hooks = Removals()
    # No task is ever published for this change set, so the daemon never consumes it: only the trimmer removes.
    async with running_daemon(nc, settings, RecordingApp(), hooks=hooks, sweep=False) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        change_set = ChangeSet(wk, cs)
        subject, stream = settings.subjects.requests(wk, cs), settings.subjects.requests_stream
        js = nc.jetstream()
        seqs = [(await js.publish(subject, f"{i}".encode())).seq for i in range(20)]
        trimmer = _trimmer(daemon, settings, change_set)

        # A few: exactly those are deleted; an earlier message on the subject is left alone (no purge below).
        await trimmer.processed(seqs[1:3])
        await trimmer.flush(5)
        assert await _stored(nc, stream, subject) == {seqs[0], *seqs[3:]}

        # A message already gone (removed by an earlier owner's late purge) counts as removed, not as a failure.
        await trimmer.processed([seqs[1], seqs[3]])
        await trimmer.flush(5)
        assert await _stored(nc, stream, subject) == {seqs[0], *seqs[4:]}
        assert daemon.stats.delete_failures == 0

        # A failed removal keeps its sequences; the next one removes them too.
        hooks.failing = True
        await trimmer.processed([seqs[4]])
        await trimmer.flush(5)
        assert daemon.stats.delete_failures == 1
        assert seqs[4] in await _stored(nc, stream, subject)
        hooks.failing = False
        await trimmer.processed([seqs[5]])
        await trimmer.flush(5)
        assert await _stored(nc, stream, subject) == {seqs[0], *seqs[6:]}

        # Many at once: one purge below the last, which covers everything earlier on the subject.
        await trimmer.processed(seqs[6:16])
        await trimmer.flush(5)
        assert await _stored(nc, stream, subject) == set(seqs[16:])


async def test_while_removals_keep_failing_what_waits_is_bounded_and_one_purge_removes_it_all(
    nc: NatsClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, idempotency_window=8)  # at most 4 wait for removal
    hooks = Removals()
    async with running_daemon(nc, settings, RecordingApp(), hooks=hooks, sweep=False) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        subject, stream = settings.subjects.requests(wk, cs), settings.subjects.requests_stream
        js = nc.jetstream()
        seqs = [(await js.publish(subject, f"{i}".encode())).seq for i in range(30)]
        trimmer = _trimmer(daemon, settings, ChangeSet(wk, cs))
        hooks.failing = True
        for seq in seqs[:20]:
            await trimmer.processed([seq])
            await trimmer.flush(5)
            assert len(trimmer._waiting) <= 4
        assert daemon.stats.delete_failures >= 20
        hooks.failing = False
        await trimmer.processed([seqs[20]])
        await trimmer.flush(5)
        assert await _stored(nc, stream, subject) == set(seqs[21:])


def test_a_purge_for_many_or_for_two_when_every_write_is_flushed() -> None:
    assert [purges(n, fsync_always=False) for n in (1, 2, 8, 9)] == [False, False, False, True]
    assert [purges(n, fsync_always=True) for n in (1, 2, 8, 9)] == [False, True, True, True]
    # A purge visits every consumer of the stream: with many, only a larger batch pays for it.
    assert [purges(n, fsync_always=True, consumers=1000) for n in (2, 9, 10)] == [False, True, True]
    assert [purges(n, fsync_always=True, consumers=500) for n in (4, 5)] == [False, True]


async def test_removals_linger_and_batch_while_the_servers_fsync_every_write(
    nc: NatsClient, subject_prefix: str
) -> None:
    """Each processed request would cost a disk flush to delete: they wait (removal_linger) and go in one purge."""
    settings = fast_settings(subject_prefix, storage="file", removal_linger=10.0)
    hooks = Removals()
    async with running_daemon(nc, settings, RecordingApp(), hooks=hooks, sweep=False) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        subject, stream = settings.subjects.requests(wk, cs), settings.subjects.requests_stream
        js = nc.jetstream()
        seqs = [(await js.publish(subject, f"{i}".encode())).seq for i in range(4)]
        lazy = Trimmer(
            ChangeSet(wk, cs),
            settings.subjects,
            requester=daemon.nats.requester,
            settings=settings,
            report=daemon.report,
            placement=Placement(fsync_always=True),
        )
        for seq in seqs[:3]:
            await lazy.processed([seq])
        assert hooks.removals == 0, "nothing removed while lingering"
        assert await _stored(nc, stream, subject) == set(seqs)
        # Letting the change set go removes what lingers at once, in one removal.
        await lazy.flush(5)
        assert hooks.removals == 1
        assert await _stored(nc, stream, subject) == {seqs[3]}

        # Without fsync every write, each processed request is removed at once.
        eager = Trimmer(
            ChangeSet(wk, cs),
            settings.subjects,
            requester=daemon.nats.requester,
            settings=settings,
            report=daemon.report,
            placement=Placement(),
        )
        await eager.processed([seqs[3]])
        assert hooks.removals == 2
        await eager.flush(5)
        assert await _stored(nc, stream, subject) == set()
