"""A query that cannot be answered (a reply over max_payload, an unreadable record) gets the documented ``error``."""

from __future__ import annotations

from dataclasses import replace

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import ChangeSetId, RebaserClient, SetLiteral, WorkspacePk
from rebaser_core.errors import RebaserRefused
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.record.store import ChangeSetStore
from rebaser_server.testing import fast_settings, running_daemon


async def test_get_over_max_payload_is_answered_with_an_error(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), SnapshotApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        chunk = "v" * (nc.max_payload // 3)
        for i in range(4):  # each request fits in a message; all the values together do not
            response = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path=f"/big/{i}", value=chunk)], timeout=20
            )
            assert response.ok
        with pytest.raises(RebaserRefused, match="max_payload"):
            await client.get_change_set(wk, cs, timeout=10)
        one = await client.get_change_set(wk, cs, "/big/0", timeout=10)  # one path still fits
        assert one.values == {"/big/0": chunk}


async def test_a_query_on_an_unreadable_record_is_answered_with_an_error(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """A record that cannot be decoded, or whose snapshot copy does not match its address, gets an error reply,
    not silence until the caller's timeout."""
    settings = fast_settings(subject_prefix)
    store = ChangeSetStore(nc.jetstream(), settings)
    await store.open()
    async with running_daemon(nc, settings, SnapshotApp()):
        wk, garbled, tampered = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
        await store.kv.put(Subjects.change_set_key(wk, garbled), b"\xff not a record")
        with pytest.raises(RebaserRefused, match="record is not valid"):
            await client.get_change_set(wk, garbled, timeout=10)

        assert (await client.enqueue_updates_with_reply(wk, tampered, [SetLiteral(path="/a", value=1)])).ok
        record = await store.read(ChangeSet(wk, tampered))
        assert record is not None and "inline" in record.state
        forged = {**record.state, "inline": record.state["inline"].replace("1", "2")}
        await store.kv.put(Subjects.change_set_key(wk, tampered), replace(record, state=forged).encode())
    # A fresh daemon (nothing cached) must read the snapshot from the record, and refuses the forged copy.
    async with running_daemon(nc, settings, SnapshotApp()):
        with pytest.raises(RebaserRefused, match="does not match"):
            await client.get_change_set(wk, tampered, timeout=10)
