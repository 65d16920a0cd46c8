"""Each busy workspace's owned and waiting work on ``/status`` and ``/metrics``, against a real nats-server."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.ops.daemon_metrics import DaemonCollector
from rebaser_server.ops.metrics import render
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import GatedApp


async def test_status_and_metrics_show_each_workspaces_owned_and_queued_tasks(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # Two slots, both held at the gate by the big workspace: its third change set and the small one's wait.
    settings = fast_settings(
        subject_prefix, concurrency=2, max_owned_per_workspace=2, quiescent_period=300, handler_deadline=120
    )
    app = GatedApp()
    async with running_daemon(nc, settings, app) as daemon:
        big, small = WorkspacePk.new(), WorkspacePk.new()
        try:
            for wk in (big, big, big, small):
                await client.enqueue_updates(wk, ChangeSetId.new(), [SetLiteral(path="/gate", value=1)])
            await wait_for(lambda: app.held == 2, timeout=20, message="two change sets held at the gate")

            async def counted() -> bool:
                status = await daemon.status()
                return bool(status["owned"]["tasks_by_workspace"] == {str(big): 3, str(small): 1})

            await wait_for(counted, timeout=20, message="every task counted per workspace")
            status = await daemon.status()
            assert status["owned"]["by_workspace"] == {str(big): 2}
            daemon.observe.metrics.bind(DaemonCollector(daemon))  # as the HTTP server does
            text = render(daemon.observe.metrics).decode()
            assert f'rebaser_tasks_by_workspace{{workspace="{big}"}} 3.0' in text
            assert f'rebaser_owned_change_sets_by_workspace{{workspace="{big}"}} 2.0' in text
        finally:
            app.gate.set()


async def test_with_the_fair_intake_status_and_metrics_show_who_waits_for_a_turn_and_the_share_served(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # Two slots, both held at the gate by the big workspace; the small one waits for a turn (no slot frees: the big
    # one's change sets are busy, not idle).
    settings = fast_settings(
        subject_prefix, concurrency=2, quiescent_period=300, handler_deadline=120, intake="fair"
    )
    app = GatedApp()
    async with running_daemon(nc, settings, app) as daemon:
        big, small = WorkspacePk.new(), WorkspacePk.new()
        try:
            for wk in (big, big, big, small):
                await client.enqueue_updates(wk, ChangeSetId.new(), [SetLiteral(path="/gate", value=1)])
            await wait_for(lambda: app.held == 2, timeout=20, message="two change sets held at the gate")

            async def small_waits() -> bool:
                intake = (await daemon.status())["intake"]
                return str(small) in intake["workspaces_waiting"]

            await wait_for(small_waits, timeout=20, message="the small workspace waits for a turn")
            status = await daemon.status()
            assert status["layout"]["intake"] == "fair" and status["intake"]["kind"] == "fair"
            assert status["leases"]["mode"] == "task"  # the default
            assert status["owned"]["served_by_workspace"] == {str(big): 2}
            assert status["owned"]["served_total"] == 2
            daemon.observe.metrics.bind(DaemonCollector(daemon))  # as the HTTP server does
            text = render(daemon.observe.metrics).decode()
            assert f'rebaser_tasks_taken_lately_by_workspace{{workspace="{big}"}} 2.0' in text
            assert (
                "rebaser_workspaces_waiting_for_a_turn 2.0" in text
            )  # the small one, and the big one's third
        finally:
            app.gate.set()
