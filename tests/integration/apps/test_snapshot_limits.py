"""Hostile sizes through the daemon: every reply fits, every over-limit request is refused, nothing freezes."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import BatchTooLarge, ChangeSetId, RebaserClient, SetFunction, SetLiteral, WorkspacePk
from rebaser_core.api import Update
from rebaser_core.api.enqueue_updates_response import MAX_LISTED_CONFLICTS
from rebaser_core.batches import MAX_BATCH_UPDATES
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.testing import fast_settings, running_daemon


async def test_a_stored_batch_of_20000_stale_updates_gets_a_bounded_conflicts_reply(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # Unbounded, this reply would make the record too large for a NATS message: the commit would fail and retry forever.
    async with running_daemon(nc, fast_settings(subject_prefix), SnapshotApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        stale: list[Update] = [
            SetLiteral(path=f"/items/{i}", value=i, expected_version="0" * 16) for i in range(20_000)
        ]
        response = await client.enqueue_updates_with_reply(
            wk, cs, await client.store_batch(wk, stale), timeout=30
        )
        assert response.status.kind == "conflicts"
        listed = response.status.conflicts
        assert len(listed) == MAX_LISTED_CONFLICTS and listed[0].path == "/items/0"
        assert listed[-1].message.endswith(f"(and {20_000 - MAX_LISTED_CONFLICTS} more conflicts not listed)")
        # The change set goes on.
        assert (await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=1)])).ok


async def test_requests_over_the_limits_are_refused_and_the_change_set_goes_on(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(
        subject_prefix,
        max_updates_per_request=20,
        max_value_bytes=1000,
        max_stored_batch_bytes=4000,
        max_snapshot_attributes=30,
    )
    async with running_daemon(nc, settings, SnapshotApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        refusals = {
            "max_updates_per_request": [SetLiteral(path=f"/a{i}", value=i) for i in range(21)],
            "max_value_bytes": [SetLiteral(path="/big", value="x" * 1000)],
            "max_stored_batch_bytes": await client.store_batch(
                wk, [SetLiteral(path=f"/p{i}", value="y" * 100) for i in range(40)]
            ),
        }
        for setting, updates in refusals.items():
            response = await client.enqueue_updates_with_reply(wk, cs, updates)
            assert response.status.kind == "error" and setting in response.status.message, response.status
        fill = [SetLiteral(path=f"/a{i}", value=i) for i in range(20)]
        assert (await client.enqueue_updates_with_reply(wk, cs, fill)).ok
        over = await client.enqueue_updates_with_reply(
            wk, cs, [SetLiteral(path=f"/b{i}", value=i) for i in range(11)]
        )
        assert over.status.kind == "error" and "max_snapshot_attributes" in over.status.message
        assert daemon.stats.requests_dead_lettered == 4
        # Nothing of a refused request was applied, and the change set goes on.
        assert (await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/ok", value=1)])).ok
        state = await client.get_change_set(wk, cs)
        assert len(state.values) == 21 and "/big" not in state.values


async def test_the_client_refuses_to_store_a_batch_over_the_limits(client: RebaserClient) -> None:
    wk = WorkspacePk.new()
    with pytest.raises(BatchTooLarge) as refused:
        await client.store_batch(wk, [SetLiteral(path="/a", value=1)] * (MAX_BATCH_UPDATES + 1))
    assert refused.value.limit == "updates"
    with pytest.raises(BatchTooLarge) as refused:
        await client.store_batch(wk, [SetLiteral(path="/a", value="x" * 100)] * 10, max_bytes=1000)
    assert refused.value.limit == "bytes"


@pytest.mark.timeout(400)  # a minute on a quiet machine; much more under load
async def test_a_canary_change_set_is_served_while_a_huge_request_is_processed(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # A 100,000-long chain of functions (the most the default limits allow): seconds of decoding, rebasing,
    # encoding and dependent values update. On the event loop, it would stall every other change set for all of it.
    # handler_deadline: on a loaded machine the huge steps take longer than the test default (10 s); a step cut short
    # as wedged would be retried from scratch, over and over. ack_wait: beside CPU hogs the lease renewals of the
    # test default (3 s) can be late five times in a row while the huge step holds the GIL, and the request is then
    # dead-lettered as one that kills its daemon; this test is about the canary, not about leases.
    settings = fast_settings(subject_prefix, handler_deadline=300, ack_wait=30.0)
    async with running_daemon(nc, settings, SnapshotApp()):
        wk, heavy, canary = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
        assert (await client.enqueue_updates_with_reply(wk, canary, [SetLiteral(path="/n", value=0)])).ok
        chain: list[Update] = [SetLiteral(path="/c0", value="v")]
        chain += [
            SetFunction(path=f"/c{i}", function="identity", args=[f"/c{i - 1}"])
            for i in range(1, MAX_BATCH_UPDATES)
        ]
        heavy_started = asyncio.get_running_loop().time()
        heavy_reply = asyncio.ensure_future(
            client.enqueue_updates_with_reply(wk, heavy, await client.store_batch(wk, chain), timeout=300)
        )

        async def heavy_settled() -> bool:
            if not heavy_reply.done():
                return False
            return not (
                await client.get_change_set(wk, heavy, f"/c{MAX_BATCH_UPDATES - 1}", timeout=30)
            ).dvu_pending

        latencies: list[float] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 300
        while not await heavy_settled():
            assert loop.time() < deadline, "the huge request was not processed in time"
            started = loop.time()
            n = len(latencies) + 1
            assert (
                await client.enqueue_updates_with_reply(
                    wk, canary, [SetLiteral(path="/n", value=n)], timeout=30
                )
            ).ok
            latencies.append(loop.time() - started)
        heavy_seconds = loop.time() - heavy_started
        assert heavy_reply.result().ok
        final = await client.get_change_set(wk, heavy, f"/c{MAX_BATCH_UPDATES - 1}")
        assert final.values == {f"/c{MAX_BATCH_UPDATES - 1}": "v"}
        print(f"\ncanary: {len(latencies)} requests, slowest {max(latencies):.2f}s")
        # Generous for a busy shared machine (about 0.5 s on a quiet one); on the event loop, the stall would last
        # the whole request (about 20 s on a quiet machine). A loaded machine slows the huge request as much as the
        # canary, so the bound grows with it: a stall of a third of the huge request's time is still a failure.
        assert len(latencies) >= 3 and max(latencies) < max(8.0, heavy_seconds / 3), (
            max(latencies),
            heavy_seconds,
        )
