"""Admission: a daemon takes on at most ``start_concurrency`` change sets at once; the next task waits in the
server, unpulled (its lease not running), until one of them has handled its first request."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.api import EnqueueUpdatesRequest
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.app import Applied, AppState, ChangeSet
from rebaser_server.testing import fast_settings, running_daemon
from tests.apps import RecordingApp


class GatedApp(RecordingApp):
    """A request with ``/gate`` set waits in apply until the test opens that change set's gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.held: defaultdict[str, int] = defaultdict(int)  # change set -> requests waiting at its gate

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        if any(getattr(u, "path", None) == "/gate" for u in getattr(request.updates, "updates", [])):
            self.held[str(change_set)] += 1
            try:
                await self.gates[str(change_set)].wait()
            finally:
                self.held[str(change_set)] -= 1
        return await super().apply(change_set, state, request)


def key(wk: WorkspacePk, cs: ChangeSetId) -> str:
    return str(ChangeSet(wk, cs))


async def test_a_change_set_waits_in_the_server_while_others_start(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    app = GatedApp()
    settings = fast_settings(subject_prefix, concurrency=10, start_concurrency=2, quiescent_period=300)
    async with running_daemon(nc, settings, app) as daemon:
        wk = WorkspacePk.new()
        gated = [ChangeSetId.new(), ChangeSetId.new()]
        for cs in gated:  # two change sets stuck in their first request: both still starting
            await client.enqueue_updates(wk, cs, [SetLiteral(path="/gate", value=1)])
            await wait_for(lambda cs=cs: app.held[key(wk, cs)] == 1, timeout=10, message="first request held")
        third = asyncio.create_task(
            client.enqueue_updates_with_reply(
                wk, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=30
            )
        )
        subjects = settings.subjects
        js = nc.jetstream()

        async def waits_unpulled() -> bool:
            # Its task stored and not delivered, and no pull request open: with 8 free slots and no admission, the
            # daemon would keep a pull open, and the server would hand the task to it at once.
            info = await js.consumer_info(subjects.tasks_stream, subjects.tasks_consumer)
            return info.num_pending == 1 and info.num_waiting == 0 and info.num_ack_pending == 2

        await wait_for(waits_unpulled, timeout=10, message="the third task waits in the server, unpulled")
        status = await daemon.status()
        assert status["owned"]["count"] == 2 and status["owned"]["starting"] == 2
        assert not third.done()

        app.gates[key(wk, gated[0])].set()  # the first one handles its first request: room for one more
        assert (await third).ok
        assert app.held[key(wk, gated[1])] == 1  # taken while the other one was still starting
        app.gates[key(wk, gated[1])].set()
        await wait_for(lambda: daemon.stats.requests_applied == 3, timeout=10, message="all three applied")
        assert (await daemon.status())["owned"]["starting"] == 0
