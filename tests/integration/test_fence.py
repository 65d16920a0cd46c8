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
from rebaser_server.state import ChangeSetStore, TaskDelivery
from rebaser_server.testing import fast_settings, running_daemon
from tests.apps import RecordingApp


async def test_two_writers_the_stale_one_is_refused(nc: NatsClient, subject_prefix: str) -> None:
    store = ChangeSetStore(nc.jetstream(), fast_settings(subject_prefix))
    await store.open()
    cs = ChangeSet(WorkspacePk.new(), ChangeSetId.new())
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
            await daemon.rt.store.acquire(
                ChangeSet(wk, cs), "intruder", {"applied": []}, TaskDelivery(10**9, 1)
            )
        ).handle
        response = await call  # the task comes back (ack_wait) and the request is applied by the new owner
        assert response.ok
        assert daemon.stats.tasks_fenced == 1
        stored = await daemon.rt.store.read(ChangeSet(wk, cs))
        assert stored is not None and stored.state["applied"] == [str(response.id)]
        assert stored.epoch > intruder.record.epoch
