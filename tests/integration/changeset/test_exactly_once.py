"""Exactly once does not depend on NATS calls succeeding: processed requests left in the stream are never applied
again, whatever the idempotency window still holds."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.hooks import Hooks
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp, applied


class FailingPurges(Hooks):
    """Every purge fails while ``failing`` is set (as during a stream leader election, or without permission)."""

    def __init__(self) -> None:
        self.failing = True
        self.refused = 0

    async def checkpoint(self, name: str, change_set: ChangeSet) -> None:
        if name == "purging" and self.failing:
            self.refused += 1
            raise RuntimeError("purge refused (injected fault)")


async def test_failed_purges_never_cause_a_second_apply(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # A small id window and a short quiet period: requests fall out of the window long before they are purged, and
    # the change set is released and re-taken (re-reading the stream from its start) several times meanwhile.
    settings = fast_settings(subject_prefix, idempotency_window=8, quiescent_period=0.2)
    hooks = FailingPurges()
    app = RecordingApp()
    async with running_daemon(nc, settings, app, hooks=hooks) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        sent = []
        for i in range(20):
            response = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/n", value=i)], timeout=10
            )
            assert response.ok
            sent.append(str(response.id))
        assert hooks.refused > 0
        # Let the change set be released and taken again with everything still in the stream.
        await wait_for(lambda: daemon.stats.tasks_taken >= 2, timeout=10, message="change set taken again")
        hooks.failing = False
        last = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=99)], timeout=10)
        sent.append(str(last.id))
        assert await applied(daemon.store, wk, cs) == sent
        assert sum(app.attempts.values()) == len(sent), "a request was applied more than once"

        async def purged() -> bool:
            info = await nc.jetstream().stream_info(settings.subjects.requests_stream)
            return info.state.messages == 0

        await wait_for(purged, timeout=10, message="processed requests purged once purges work again")
