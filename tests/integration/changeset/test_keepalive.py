"""No lease outlives its work: once a change set is released, nothing renews its task's lease any more.

A renewal loop that outlives its processor holds a finished task for ever: it is never redelivered and its change
set never served again (a keep-alive task per change set risks it: its cancellation can be swallowed by
``asyncio.wait_for`` inside nats-py on Python 3.11). Renewals come from the daemon's one lease keeper, which drops a
change set synchronously when its processor ends.
"""

from __future__ import annotations

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp


async def test_no_lease_is_renewed_after_its_change_set_is_released(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, progress_period=0.3, quiescent_period=0.2, intake="fifo")
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk = WorkspacePk.new()
        for _ in range(8):
            response = await client.enqueue_updates_with_reply(
                wk, ChangeSetId.new(), [SetLiteral(path="/x", value=1)], timeout=30
            )
            assert response.ok
        await wait_for(lambda: daemon.stats.tasks_released >= 8, timeout=30, message="all released")
        await wait_for(lambda: daemon.keeper.watching == 0, timeout=10, message="no lease renewed any more")
        info = await nc.jetstream().consumer_info(
            settings.subjects.tasks_stream, settings.subjects.tasks_consumer
        )
        assert info.num_ack_pending == 0
