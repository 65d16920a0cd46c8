"""Reading a change set's record over the light requester: as nats-py reads it, deleted keys included, by
``STREAM.MSG.GET`` and by direct get; and the direct get itself, whose stored headers are the sender's."""

from __future__ import annotations

import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.js import api as js_api
from nats.js.errors import APIError

from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.requester import Requester, last_message_direct
from rebaser_server.app import ChangeSet
from rebaser_server.record.model import ChangeSetRecord
from rebaser_server.record.store import ChangeSetStore, TaskDelivery
from rebaser_server.testing import fast_settings


@pytest.mark.parametrize("direct", [True, False], ids=["direct-get", "msg-get"])
async def test_records_read_over_the_requester_match_nats_py(
    nc: NatsClient, subject_prefix: str, direct: bool
) -> None:
    settings = fast_settings(subject_prefix)
    requester = Requester(nc)
    light, plain = (
        ChangeSetStore(nc.jetstream(), settings, requester),
        ChangeSetStore(nc.jetstream(), settings),
    )
    await light.open()
    await plain.open()
    # A bucket made now, with one replica, allows direct gets, and only its leader can answer them.
    assert light.reads is not None
    assert await light.reads.allowed(light.kv._stream) is True
    if not direct:

        async def never(stream: str) -> bool:
            return False

        light.reads.allowed = never  # type: ignore[method-assign]  # every read by STREAM.MSG.GET
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


async def test_a_direct_get_tells_a_stored_status_header_from_the_servers_status(
    nc: NatsClient, subject_prefix: str
) -> None:
    js = nc.jetstream()
    stream = f"{subject_prefix}_DIRECT"
    await js.add_stream(
        js_api.StreamConfig(name=stream, subjects=[f"{subject_prefix}.d.>"], allow_direct=True)
    )
    await js.add_stream(js_api.StreamConfig(name=f"{stream}_NO", subjects=[f"{subject_prefix}.n.>"]))
    requester = Requester(nc)
    try:
        # Anyone able to publish a request chooses its headers: one that says "404", or "503" with no body (nats-py's
        # "no responders"), is still a stored message, and its own Nats-Sequence does not pass for the server's.
        for i, (hostile, body) in enumerate(
            [
                ({"Status": "404", "Description": "Message Not Found"}, b"body"),
                ({"Status": "503"}, b""),
                ({"Nats-Sequence": "1"}, b"x"),
            ]
        ):
            subject = f"{subject_prefix}.d.h{i}"
            ack = await js.publish(subject, body, headers=hostile)
            found = await last_message_direct(requester, stream, subject, timeout=5)
            assert found is not None and found.data == body
            assert found.headers is not None and int(found.headers["Nats-Sequence"]) == ack.seq
        assert await last_message_direct(requester, stream, f"{subject_prefix}.d.none", timeout=5) is None
        with pytest.raises(APIError):  # the server's refusal, not "nothing there"
            await last_message_direct(requester, stream, "", timeout=5)
        with pytest.raises(nats.errors.NoRespondersError):  # a stream that does not allow direct gets
            await last_message_direct(requester, f"{stream}_NO", f"{subject_prefix}.n.x", timeout=5)
    finally:
        await requester.close()
        await js.delete_stream(stream)
        await js.delete_stream(f"{stream}_NO")


async def test_a_bucket_made_without_direct_gets_is_read_from_its_leader(
    nc: NatsClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    # As a deployment made before buckets allowed direct gets, or with replicas, has it.
    await nc.jetstream().create_key_value(
        js_api.KeyValueConfig(
            bucket=settings.subjects.change_sets_bucket, history=1, storage=js_api.StorageType.MEMORY
        )
    )
    requester = Requester(nc)
    store = ChangeSetStore(nc.jetstream(), settings, requester)
    await store.open()
    try:
        assert store.reads is not None and await store.reads.allowed(store.kv._stream) is False
        change_set = ChangeSet(WorkspacePk.new(), ChangeSetId.new())

        async def has_work() -> bool:
            return True

        acquired = await store.acquire(change_set, "a", {"n": 0}, TaskDelivery(1, 1), has_work=has_work)
        assert await acquired.handle.still_owner()
    finally:
        await requester.close()
