"""Reading a change set's record over the light requester: as nats-py reads it, deleted keys included."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient

from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.requester import Requester
from rebaser_server.app import ChangeSet
from rebaser_server.state import ChangeSetRecord, ChangeSetStore, TaskDelivery
from rebaser_server.testing import fast_settings


async def test_records_read_over_the_requester_match_nats_py(nc: NatsClient, subject_prefix: str) -> None:
    settings = fast_settings(subject_prefix)
    requester = Requester(nc)
    light, plain = (
        ChangeSetStore(nc.jetstream(), settings, requester),
        ChangeSetStore(nc.jetstream(), settings),
    )
    await light.open()
    await plain.open()
    try:
        change_set = ChangeSet(WorkspacePk.new(), ChangeSetId.new())

        async def has_work() -> bool:
            return True

        # Never written: created (epoch 1).
        first = await light.acquire(change_set, "a", {"n": 0}, TaskDelivery(1, 1), has_work=has_work)
        assert first.handle.record.epoch == 1
        await first.handle.commit(ChangeSetRecord(epoch=1, owner="a", state={"n": 5}, applied_seq=7))
        # Taken again: read, then bumped with compare-and-set on the revision read.
        for store, owner, epoch in ((light, "b", 2), (plain, "c", 3)):
            again = await store.acquire(
                change_set, owner, {"n": 0}, TaskDelivery(2, epoch), has_work=has_work
            )
            assert (
                again.handle.record.epoch,
                again.handle.record.state,
                again.handle.record.applied_seq,
            ) == (
                epoch,
                {"n": 5},
                7,
            )
        assert not await first.handle.still_owner()
        assert await again.handle.still_owner()
        # Deleted (a DEL marker is the key's last message): no owner holds it, and it is created afresh.
        await light.kv.delete(light._key(change_set))
        assert not await again.handle.still_owner()
        fresh = await light.acquire(change_set, "d", {"n": 0}, TaskDelivery(3, 1), has_work=has_work)
        assert (fresh.handle.record.epoch, fresh.handle.record.state) == (1, {"n": 0})
        assert await fresh.handle.still_owner()
    finally:
        await requester.close()
