"""No lease outlives its work: once a change set is released, nothing renews its task's lease any more. And an idle
change set keeps its lease with fewer renewals than one with work in hand.

A renewal loop that outlived its processor once held a finished task for ever: it was never redelivered and its
change set never served again (found by the KV write fault battery; the per-change-set keep-alive task's
cancellation could be swallowed by ``asyncio.wait_for`` inside nats-py on Python 3.11). Renewals now come from the
daemon's one lease keeper, which drops a change set synchronously when its processor ends.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.apps import GatedApp, RecordingApp


async def test_no_lease_is_renewed_after_its_change_set_is_released(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, progress_period=0.3, quiescent_period=0.2)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk = WorkspacePk.new()
        for _ in range(8):
            response = await client.enqueue_updates_with_reply(
                wk, ChangeSetId.new(), [SetLiteral(path="/x", value=1)], timeout=30
            )
            assert response.ok
        await wait_for(lambda: daemon.rt.stats.tasks_released >= 8, timeout=30, message="all released")
        await wait_for(
            lambda: daemon.rt.keeper.watching == 0, timeout=10, message="no lease renewed any more"
        )
        info = await nc.jetstream().consumer_info(
            settings.subjects.tasks_stream, settings.subjects.tasks_consumer
        )
        assert info.num_ack_pending == 0


async def test_an_idle_change_set_keeps_its_lease_with_fewer_renewals(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # ack_wait 3 s less its margin (0.6 s): a lease of 2.4 s. Busy, it is renewed on every pass of the keeper (every
    # 0.5 s); idle, once it has two periods (1 s) left: every third pass or so.
    settings = fast_settings(subject_prefix, quiescent_period=60.0)
    app = GatedApp()
    async with running_daemon(nc, settings, app) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        gated = asyncio.ensure_future(
            client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/gate", value=1)], timeout=30)
        )
        await wait_for(lambda: app.held == 1, timeout=10, message="the request at the gate")
        (processor,) = daemon._active.values()
        assert not processor.idle()  # a request in hand
        app.gate.set()
        assert (await gated).ok
        await wait_for(processor.idle, timeout=10, message="idle once the request is answered")

        passes = 0
        watch = processor.watch

        def counted(now: float) -> bool:
            nonlocal passes
            passes += 1
            return watch(now)

        processor.watch = counted  # type: ignore[method-assign]
        renewed = processor.lease.renewals
        # Three idle renewals span more than a whole ack_wait: the lease was kept by them alone.
        await wait_for(
            lambda: processor.lease.renewals >= renewed + 3, timeout=30, message="three idle renewals"
        )
        assert daemon.stats.leases_lost == 0
        # Busy, every pass renews (as many renewals as passes); idle, about one pass in three.
        idle_renewals = processor.lease.renewals - renewed
        assert passes >= 1.5 * idle_renewals, (passes, idle_renewals)
        # Still this ownership's: the next request is answered without another activation.
        response = await client.enqueue_updates_with_reply(
            wk, cs, [SetLiteral(path="/x", value=2)], timeout=30
        )
        assert response.ok
        assert daemon.stats.tasks_taken == 1
