"""Hostile sizes through the daemon: every reply fits, every over-limit request is refused, nothing freezes."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient

from rebaser_client import ChangeSetId, RebaserClient, SetLiteral, WorkspacePk
from rebaser_core.api import Update
from rebaser_core.api.enqueue_updates_response import MAX_LISTED_CONFLICTS
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.testing import fast_settings, running_daemon


async def test_a_stored_batch_of_20000_stale_updates_gets_a_bounded_conflicts_reply(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # Unbounded, this reply made the record too large for a NATS message: the commit failed and retried forever.
    async with running_daemon(nc, fast_settings(subject_prefix), SnapshotApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        stale: list[Update] = [
            SetLiteral(path=f"/items/{i}", value=i, expected_version="0" * 16) for i in range(20_000)
        ]
        response = await client.enqueue_updates_with_reply(
            wk, cs, await client.store_batch(stale), timeout=30
        )
        assert response.status.kind == "conflicts"
        listed = response.status.conflicts
        assert len(listed) == MAX_LISTED_CONFLICTS and listed[0].path == "/items/0"
        assert listed[-1].message.endswith(f"(and {20_000 - MAX_LISTED_CONFLICTS} more conflicts not listed)")
        # The change set goes on.
        assert (await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=1)])).ok
