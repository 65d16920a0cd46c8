"""A full daemon makes room from its busiest workspace first, against a real nats-server: when a newcomer waits for
a slot, the idle change sets of the workspace owning most of the daemon give way, and a small workspace's idle
change set stays owned; should the busiest have nothing idle, any idle change set still gives way."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import GatedApp, RecordingApp


async def test_the_busiest_workspace_gives_way_and_a_small_one_keeps_its_change_set(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # Four slots, no per-workspace share (so the big workspace may take three of them), and a quiet period far
    # longer than the test: nothing lets go unless it gives way.
    settings = fast_settings(subject_prefix, concurrency=4, max_owned_per_workspace=4, quiescent_period=300)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        big, small, newcomer = WorkspacePk.new(), WorkspacePk.new(), WorkspacePk.new()
        for wk in (big, big, big, small):  # answered, then idle and owned
            reply = await client.enqueue_updates_with_reply(
                wk, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=20
            )
            assert reply.ok
        assert daemon.owned_by_workspace == {str(big): 3, str(small): 1}
        released = daemon.stats.tasks_released

        reply = await client.enqueue_updates_with_reply(
            newcomer, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=30
        )
        assert reply.ok
        owned = daemon.owned_by_workspace
        assert owned.get(str(small)) == 1  # the small workspace's idle change set stayed
        assert owned.get(str(big), 0) < 3 and daemon.stats.tasks_released > released  # the big one's gave way


async def test_with_nothing_idle_in_the_busiest_workspace_a_small_one_still_gives_way(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(
        subject_prefix,
        concurrency=3,
        max_owned_per_workspace=3,
        quiescent_period=300,
        handler_deadline=120,  # the big workspace's requests are held until the end
        intake="fifo",  # the fair intake never makes a small workspace give way (fair-share.md)
    )
    app = GatedApp()
    async with running_daemon(nc, settings, app) as daemon:
        big, small, newcomer = WorkspacePk.new(), WorkspacePk.new(), WorkspacePk.new()
        try:
            for _ in range(2):  # busy: held at the gate
                await client.enqueue_updates(big, ChangeSetId.new(), [SetLiteral(path="/gate", value=1)])
            await wait_for(lambda: app.held == 2, timeout=20, message="the big workspace's requests held")
            reply = await client.enqueue_updates_with_reply(
                small, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=20
            )
            assert reply.ok
            assert daemon.owned_by_workspace == {str(big): 2, str(small): 1}

            reply = await client.enqueue_updates_with_reply(
                newcomer, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=30
            )
            assert reply.ok
            # Served before any of the big workspace's requests ended: the small workspace's idle change set let go.
            assert app.held == 2 and daemon.owned_by_workspace.get(str(big)) == 2
            assert str(small) not in daemon.owned_by_workspace
        finally:
            app.gate.set()  # the held requests end before the daemon's shutdown
