"""The change-set store (``rebaser_server/record/store.py``) and its handle (``handle.py``) against a real
nats-server, through nats-py's KeyValue and through the daemon's light requester: acquire bumps the epoch and fences
the handle before it; commits are compare-and-set; a stale delivery, a task with nothing to do and a change of shard
are told apart.

(``tests/integration/changeset/test_fence.py`` has the fence as a daemon meets it, ``test_record_reads.py`` the
reads by direct get.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_core.errors import FencedError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.requester import Requester
from rebaser_server.app import ChangeSet
from rebaser_server.record.handle import ChangeSetHandle
from rebaser_server.record.store import (
    Acquired,
    ChangeSetStore,
    NothingToDo,
    StaleDelivery,
    TaskDelivery,
)
from rebaser_server.testing import fast_settings

INITIAL: dict[str, list[str]] = {"applied": []}


@pytest.fixture(params=["kv", "requester"])
async def store(
    request: pytest.FixtureRequest, nc: NatsClient, subject_prefix: str
) -> AsyncIterator[ChangeSetStore]:
    requester = Requester(nc) if request.param == "requester" else None
    store = ChangeSetStore(nc.jetstream(), fast_settings(subject_prefix), requester)
    await store.open()
    try:
        yield store
    finally:
        if requester is not None:
            await requester.close()


def _change_set() -> ChangeSet:
    return ChangeSet(WorkspacePk.new(), ChangeSetId.new())


async def _owned(store: ChangeSetStore, cs: ChangeSet, owner: str, delivery: TaskDelivery) -> Acquired:
    """Acquire and write the record at once (a first delivery writes it only at its first commit)."""
    acquired = await store.acquire(cs, owner, INITIAL, delivery)
    await acquired.handle.commit(acquired.handle.record)
    return acquired


async def test_acquire_fences_the_previous_owner_and_commits_are_compare_and_set(
    store: ChangeSetStore,
) -> None:
    cs = _change_set()
    first = (await store.acquire(cs, "a", INITIAL, TaskDelivery(1, 1))).handle
    assert first.record.epoch == 1 and not first.written
    await first.commit(replace(first.record, state={"applied": ["r1"]}, applied_seq=4))
    assert first.written and first.record.state == {"applied": ["r1"]}
    revision = first.revision
    await first.commit(replace(first.record, state={"applied": ["r1", "r2"]}, applied_seq=5))
    assert first.revision > revision  # every commit moves the revision the next one expects
    stored = await store.read(cs)
    assert stored is not None and (stored.state, stored.applied_seq, stored.owner) == (
        {"applied": ["r1", "r2"]},
        5,
        "a",
    )
    assert await first.still_owner()

    second = (await store.acquire(cs, "b", INITIAL, TaskDelivery(2, 1))).handle
    # Taken over from what was committed: the state and watermark carry over, the epoch moves on.
    assert (second.record.epoch, second.record.owner, second.record.state, second.record.applied_seq) == (
        2,
        "b",
        {"applied": ["r1", "r2"]},
        5,
    )
    assert not await first.still_owner() and await second.still_owner()
    with pytest.raises(FencedError):
        await first.commit(replace(first.record, state={"applied": ["stale"]}))
    assert first.record.state == {"applied": ["r1", "r2"]}  # a refused commit changes nothing, here either
    stored = await store.read(cs)
    assert stored is not None and stored.owner == "b" and stored.epoch == 2
    await second.commit(replace(second.record, state={"applied": ["r1", "r2", "r3"]}))
    stored = await store.read(cs)
    assert stored is not None and stored.state == {"applied": ["r1", "r2", "r3"]}


async def test_read_of_a_change_set_never_written_is_none(store: ChangeSetStore) -> None:
    assert await store.read(_change_set()) is None


async def test_a_delivery_not_newer_than_the_owners_is_stale_and_changes_nothing(
    store: ChangeSetStore,
) -> None:
    cs = _change_set()
    await _owned(store, cs, "a", TaskDelivery(7, 2))
    for stale in (TaskDelivery(7, 2), TaskDelivery(7, 1)):
        with pytest.raises(StaleDelivery):
            await store.acquire(cs, "late", INITIAL, stale)
    stored = await store.read(cs)
    assert stored is not None and (stored.owner, stored.epoch, stored.task_delivery) == ("a", 1, 2)


async def test_a_takeover_of_the_same_task_is_unclean_unless_it_was_handed_back(
    store: ChangeSetStore,
) -> None:
    cs = _change_set()
    owner = (await store.acquire(cs, "a", INITIAL, TaskDelivery(3, 1))).handle
    await owner.commit(owner.record)
    # The same task message redelivered without a hand-back: its owner died or froze holding it.
    died = await store.acquire(cs, "b", INITIAL, TaskDelivery(3, 2))
    assert died.unclean
    # Handed back on purpose (nack): the next delivery is a clean takeover, and the mark is cleared.
    await died.handle.commit(replace(died.handle.record, handed_back=True))
    clean = await store.acquire(cs, "c", INITIAL, TaskDelivery(3, 3))
    assert not clean.unclean and clean.handle.record.handed_back is False
    # Another task message (the last one was acked, a new one published): clean whatever came before.
    other = await store.acquire(cs, "d", INITIAL, TaskDelivery(9, 1))
    assert not other.unclean
    assert (other.handle.record.task_seq, other.handle.record.task_delivery) == (9, 1)
    assert other.handle.record.epoch == 4


async def test_a_task_with_no_record_and_nothing_queued_creates_nothing(store: ChangeSetStore) -> None:
    cs = _change_set()

    async def nothing() -> bool:
        return False

    async def work() -> bool:
        return True

    with pytest.raises(NothingToDo):
        await store.acquire(cs, "a", INITIAL, TaskDelivery(1, 1), has_work=nothing)
    with pytest.raises(NothingToDo):
        await store.acquire(cs, "a", INITIAL, TaskDelivery(1, 2), has_work=nothing)
    assert await store.read(cs) is None
    # With work queued: a first delivery writes nothing yet; a redelivery writes the record at once (unclean).
    first = await store.acquire(cs, "a", INITIAL, TaskDelivery(1, 1), has_work=work)
    assert not first.unclean and await store.read(cs) is None
    again = await store.acquire(cs, "b", INITIAL, TaskDelivery(1, 2), has_work=work)
    assert again.unclean
    stored = await store.read(cs)
    assert stored is not None and (stored.owner, stored.epoch, stored.state) == ("b", 1, INITIAL)
    # Once there is a record, has_work is not asked: the record is the work.
    later = await store.acquire(cs, "c", INITIAL, TaskDelivery(2, 1), has_work=nothing)
    assert later.handle.record.epoch == 2


async def test_a_change_set_taken_in_another_shard_starts_its_sequences_over(store: ChangeSetStore) -> None:
    cs = _change_set()
    owner = (await store.acquire(cs, "a", INITIAL, TaskDelivery(5, 1))).handle
    await owner.commit(
        replace(owner.record, state={"applied": ["r1"]}, applied_seq=40, suspect=(41, 1), attempts={"r2": 1})
    )
    moved = await store.acquire(cs, "b", INITIAL, TaskDelivery(5, 2), shard=1)
    record = moved.handle.record
    assert (record.shard, record.applied_seq, record.suspect) == (1, 0, None)
    assert (record.task_seq, record.task_delivery) == (5, 2)
    assert not moved.unclean  # sequences of another stream: not the same task message
    assert record.state == {"applied": ["r1"]} and dict(record.attempts) == {"r2": 1}
    stored = await store.read(cs)
    assert stored is not None and stored.shard == 1 and stored.epoch == 2


async def test_create_writes_a_forked_record_once(store: ChangeSetStore) -> None:
    cs = _change_set()
    assert await store.create(cs, "forker", {"applied": ["from parent"]})
    assert not await store.create(cs, "forker", {"applied": ["again"]})
    stored = await store.read(cs)
    assert stored is not None and (stored.epoch, stored.state) == (0, {"applied": ["from parent"]})
    # Its first owner takes it over like any record: epoch bumped, state kept.
    acquired = await store.acquire(cs, "a", INITIAL, TaskDelivery(1, 1))
    assert (acquired.handle.record.epoch, acquired.handle.record.state) == (1, {"applied": ["from parent"]})
    assert acquired.handle.written  # the takeover's compare-and-set wrote it


async def test_a_deleted_record_fences_its_owner(store: ChangeSetStore) -> None:
    cs = _change_set()
    owner = (await store.acquire(cs, "a", INITIAL, TaskDelivery(1, 1))).handle
    await owner.commit(owner.record)
    await store.kv.delete(store._key(cs))
    assert not await owner.still_owner()
    with pytest.raises(FencedError):
        await owner.commit(replace(owner.record, state={"applied": ["after delete"]}))
    assert await store.read(cs) is None


async def test_using_a_store_before_open_is_an_error(nc: NatsClient, subject_prefix: str) -> None:
    store = ChangeSetStore(nc.jetstream(), fast_settings(subject_prefix))
    with pytest.raises(RuntimeError, match="open"):
        await store.read(_change_set())


async def test_a_commit_whose_answer_was_lost_but_was_stored_does_not_fence_its_owner(
    store: ChangeSetStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The write reaches the store, its answer does not (a timeout, a leader change). Read back at once, it is found
    # stored: the commit stands (fencing the owner out of its own change set made its task wait out ack_wait).
    cs = _change_set()
    handle = (await _owned(store, cs, "a", TaskDelivery(1, 1))).handle
    write = handle._write

    async def stored_then_lost(value: bytes, headers: dict[str, str] | None) -> int:
        monkeypatch.setattr(handle, "_write", write)  # once
        await write(value, headers)
        raise TimeoutError("the answer was lost")

    monkeypatch.setattr(handle, "_write", stored_then_lost)
    await handle.commit(replace(handle.record, state={"applied": ["r1"]}, applied_seq=4))
    assert (handle.record.state, handle.record.applied_seq) == ({"applied": ["r1"]}, 4)
    await handle.commit(replace(handle.record, state={"applied": ["r1", "r2"]}, applied_seq=5))
    stored = await store.read(cs)
    assert stored is not None and (stored.state, stored.applied_seq) == ({"applied": ["r1", "r2"]}, 5)
    assert await handle.still_owner()

    # The read back fails too: the commit raises, and the next one finds its own write stored and goes on from it.
    _unreadable_once(handle, monkeypatch)
    monkeypatch.setattr(handle, "_write", stored_then_lost)
    with pytest.raises(TimeoutError):
        await handle.commit(replace(handle.record, state={"applied": ["r1", "r2", "r3"]}, applied_seq=6))
    await handle.commit(replace(handle.record, state={"applied": ["r1", "r2", "r3", "r4"]}, applied_seq=7))
    stored = await store.read(cs)
    assert stored is not None and stored.applied_seq == 7 and await handle.still_owner()

    # A lost answer again, then another owner takes over: the stored record is not this owner's any more, fenced.
    _unreadable_once(handle, monkeypatch)
    monkeypatch.setattr(handle, "_write", stored_then_lost)
    with pytest.raises(TimeoutError):
        await handle.commit(replace(handle.record, state={"applied": ["r5"]}, applied_seq=8))
    second = (await store.acquire(cs, "b", INITIAL, TaskDelivery(2, 1))).handle
    await second.commit(second.record)
    with pytest.raises(FencedError):
        await handle.commit(replace(handle.record, state={"applied": ["stale"]}, applied_seq=9))
    stored = await store.read(cs)
    assert stored is not None and stored.owner == "b"


class _Reads:
    """Reads back of the handle's own writes fail while ``blocked`` (NATS trouble)."""

    def __init__(self, handle: ChangeSetHandle, monkeypatch: pytest.MonkeyPatch) -> None:
        self.blocked = False
        read_back = handle._own_write_landed

        async def maybe(value: bytes) -> bool:
            if self.blocked:
                raise TimeoutError("no answer to the read either")
            return await read_back(value)

        monkeypatch.setattr(handle, "_own_write_landed", maybe)


def _unreadable_once(handle: ChangeSetHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    """The handle's next read back of its own write fails (NATS trouble), once."""
    read_back = handle._own_write_landed

    async def unreadable(value: bytes) -> bool:
        monkeypatch.setattr(handle, "_own_write_landed", read_back)
        raise TimeoutError("no answer to the read either")

    monkeypatch.setattr(handle, "_own_write_landed", unreadable)


async def test_a_write_after_a_stored_commit_whose_answer_was_lost_does_not_roll_it_back(
    store: ChangeSetStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A commit is stored, its answer lost, and the read back fails too. The next write that is built from the
    # handle's record (a lapse claim here; a hand-back mark, a DVU run and the next group do the same) was built
    # from the record before that commit, and stored over it: the applied request was rolled back.
    cs = _change_set()
    handle = (await _owned(store, cs, "a", TaskDelivery(1, 1))).handle
    await handle.commit(replace(handle.record, state={"applied": ["r0"]}, applied_seq=3))
    write = handle._write

    async def stored_then_lost(value: bytes, headers: dict[str, str] | None) -> int:
        monkeypatch.setattr(handle, "_write", write)
        await write(value, headers)
        raise TimeoutError("the answer was lost")

    monkeypatch.setattr(handle, "_write", stored_then_lost)
    reads = _Reads(handle, monkeypatch)
    reads.blocked = True
    with pytest.raises(TimeoutError):
        await handle.commit(replace(handle.record, state={"applied": ["r0", "r1"]}, applied_seq=4))
    reads.blocked = False  # the store answers again
    assert await handle.claim_after_lapse() is True
    stored = await store.read(cs)
    assert stored is not None and stored.reaped
    assert (stored.state, stored.applied_seq) == ({"applied": ["r0", "r1"]}, 4)


async def test_every_write_carries_the_window_on_a_takeover_and_a_peers_mark_included(
    store: ChangeSetStore,
) -> None:
    # The window is the record's, in the header of its writes (the record feed): a write that decides no event (a
    # takeover's epoch bump, a peer marking a silent owner's record) carries it on unchanged, with new = 0.
    from rebaser_core.api import EVENTS_HEADER, event_text, read_window

    cs = _change_set()
    handle = (await _owned(store, cs, "a", TaskDelivery(1, 1))).handle
    events = [
        {
            "id": str(RequestId.new()),
            "workspace_id": str(cs.workspace_id),
            "change_set_id": str(cs.change_set_id),
            "kind": "applied",
            "durable": True,
            "at": 1.0,
            "seq": seq,
        }
        for seq in (1, 2)
    ]
    await handle.commit(replace(handle.record, events=2, feed=tuple(event_text(e) for e in events)))

    async def last_window() -> tuple[int, list[int]]:
        bucket = store.kv._name
        raw = await store.kv._js.get_last_msg(
            f"KV_{bucket}", f"$KV.{bucket}.{cs.workspace_id}.{cs.change_set_id}"
        )
        assert raw.headers is not None
        window = read_window(raw.headers[EVENTS_HEADER], cs.workspace_id, cs.change_set_id)
        return window.new, [e.seq for e in window.events]

    assert await last_window() == (2, [1, 2])
    taken = (await store.acquire(cs, "b", INITIAL, TaskDelivery(2, 1))).handle
    assert taken.record.feed == handle.record.feed and await last_window() == (0, [1, 2])
    assert await store.mark_reaped(cs, "b") is not None
    assert await last_window() == (0, [1, 2])
    again = (await store.acquire(cs, "c", INITIAL, TaskDelivery(3, 1))).handle
    assert again.record.reaped is False and again.record.feed == handle.record.feed
