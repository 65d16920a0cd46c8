"""Fair share across workspaces against a real nats-server: a daemon owns at most ``max_owned_per_workspace``
change sets of one workspace, so another workspace's change set is taken while a flood's backlog still waits; the
flood's deferred tasks are never lost and need no orphan sweep."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp

FLOOD = 40


async def test_another_workspace_is_served_while_a_flood_waits_and_a_flood_alone_takes_every_slot(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # 4 slots; 2 of them at most for one workspace while another has tasks (the default: half of concurrency).
    settings = fast_settings(subject_prefix, concurrency=4, quiescent_period=0.2, intake="fifo")
    async with running_daemon(nc, settings, RecordingApp(), sweep=False) as daemon:
        flood, other = WorkspacePk.new(), WorkspacePk.new()
        flooded = [ChangeSetId.new() for _ in range(FLOOD)]
        for cs in flooded:  # each holds its slot for a while
            await client.enqueue_updates(flood, cs, [SetLiteral(path="/sleep", value=0.3)])
        # Alone, the flood takes every slot.
        await wait_for(
            lambda: daemon.owned_by_workspace.get(str(flood)) == 4,
            timeout=20,
            message="every slot the flood's",
        )
        reply = await client.enqueue_updates_with_reply(other, ChangeSetId.new(), [], timeout=20)
        assert reply.ok
        assert (
            daemon.stats.tasks_deferred_fair_share > 0
        )  # the flood's tasks went back while the other waited

        async def flood_applied() -> int:
            applied = 0
            for cs in flooded:
                record = await daemon.store.read(ChangeSet(flood, cs))
                applied += 0 if record is None else len(record.state["applied"])
            return applied

        # Answered while most of the flood still waited (without the share it waits behind all of it).
        assert await flood_applied() < FLOOD / 2
        # Nothing of the flood is lost, and no orphan sweep was needed (it is off).
        for cs in flooded:
            await client.wait_settled(flood, cs, timeout=60)
        assert await flood_applied() == FLOOD
        status = await daemon.status()
        assert status["owned"]["workspace_share"] == 2
        assert status["stats"]["tasks_deferred_fair_share"] > 0
