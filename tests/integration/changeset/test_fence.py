"""Commits are fenced: a stale owner cannot overwrite the work of the daemon that took its change set over."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.errors import FencedError
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.record.store import ChangeSetStore, TaskDelivery
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp


async def _store_and_change_set(nc: NatsClient, subject_prefix: str) -> tuple[ChangeSetStore, ChangeSet]:
    store = ChangeSetStore(nc.jetstream(), fast_settings(subject_prefix))
    await store.open()
    return store, ChangeSet(WorkspacePk.new(), ChangeSetId.new())


async def test_two_writers_the_stale_one_is_refused(nc: NatsClient, subject_prefix: str) -> None:
    store, cs = await _store_and_change_set(nc, subject_prefix)
    stale = (await store.acquire(cs, "stale", {"applied": []}, TaskDelivery(1, 1))).handle
    await stale.commit(replace(stale.record, state={"applied": ["r1"]}))
    fresh = (await store.acquire(cs, "fresh", {"applied": []}, TaskDelivery(1, 2))).handle
    assert fresh.record.epoch == stale.record.epoch + 1
    await fresh.commit(replace(fresh.record, state={"applied": ["r1", "r2"]}))
    with pytest.raises(FencedError):
        await stale.commit(replace(stale.record, state={"applied": ["r1", "stale write"]}))
    stored = await store.read(cs)
    assert stored is not None and stored.state == {"applied": ["r1", "r2"]} and stored.owner == "fresh"
    assert not await stale.still_owner() and await fresh.still_owner()


async def test_owner_taken_over_mid_request_is_fenced_and_request_applied_once(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, ack_wait=2, progress_period=0.5)
    app = RecordingApp()
    async with running_daemon(nc, settings, app) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        call = asyncio.create_task(
            client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/sleep", value=0.5)], timeout=20)
        )
        await wait_for(
            lambda: app.active[str(ChangeSet(wk, cs))] == 1, timeout=10, message="apply in progress"
        )
        # Another daemon takes the change set over while this one is inside apply (as after a long pause).
        # (A delivery of another task message: the daemon's own delivery cannot prove it stale.)
        intruder = (
            await daemon.store.acquire(ChangeSet(wk, cs), "intruder", {"applied": []}, TaskDelivery(10**9, 1))
        ).handle
        # A first delivery of a new change set writes its record at its first commit (state.py); write it now.
        await intruder.commit(intruder.record)
        response = await call  # the task comes back (ack_wait) and the request is applied by the new owner
        assert response.ok
        assert daemon.stats.tasks_fenced == 1
        stored = await daemon.store.read(ChangeSet(wk, cs))
        assert stored is not None and stored.state["applied"] == [str(response.id)]
        assert stored.epoch > intruder.record.epoch


async def test_a_new_change_set_is_written_by_its_first_commit_and_still_fenced(
    nc: NatsClient, subject_prefix: str
) -> None:
    store, cs = await _store_and_change_set(nc, subject_prefix)
    # Two first deliveries (two task messages, as after a purge of the tasks stream): neither writes on acquire.
    first = await store.acquire(cs, "a", {"applied": []}, TaskDelivery(1, 1))
    second = await store.acquire(cs, "b", {"applied": []}, TaskDelivery(2, 1))
    assert await store.read(cs) is None
    assert not first.unclean and not second.unclean
    assert await first.handle.still_owner() and await second.handle.still_owner()
    await second.handle.commit(replace(second.handle.record, state={"applied": ["b1"]}))
    with pytest.raises(FencedError):  # the same compare-and-set as a create: only one first commit lands
        await first.handle.commit(replace(first.handle.record, state={"applied": ["a1"]}))
    stored = await store.read(cs)
    assert stored is not None and stored.state == {"applied": ["b1"]} and stored.owner == "b"
    assert not await first.handle.still_owner() and await second.handle.still_owner()


async def test_a_redelivered_task_with_no_record_is_an_unclean_takeover_written_at_once(
    nc: NatsClient, subject_prefix: str
) -> None:
    store, cs = await _store_and_change_set(nc, subject_prefix)
    # The first delivery's owner may have died inside the first request before writing anything.
    gone = await store.acquire(cs, "gone", {"applied": []}, TaskDelivery(1, 1))
    taken = await store.acquire(cs, "next", {"applied": []}, TaskDelivery(1, 2))
    assert taken.unclean  # the first request is a suspect: the suspect count needs the record written now
    stored = await store.read(cs)
    assert stored is not None and stored.owner == "next" and stored.task_delivery == 2
    with pytest.raises(FencedError):
        await gone.handle.commit(replace(gone.handle.record, state={"applied": ["late"]}))
    assert not await gone.handle.still_owner()
