"""Admission: a daemon takes on at most ``start_concurrency`` change sets at once; the next task waits in the
server, unpulled (its lease not running), until one of them has started (its first request delivered)."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.hooks import Hooks
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp


class HoldAfterAcquire(Hooks):
    """Holds chosen change sets in their cold path: after their record was acquired, before they consume."""

    def __init__(self) -> None:
        self.gates: dict[ChangeSet, asyncio.Event] = {}
        self.held: set[ChangeSet] = set()

    async def checkpoint(self, name: str, change_set: ChangeSet) -> None:
        if name == "acquired" and change_set in self.gates:
            self.held.add(change_set)
            await self.gates[change_set].wait()


async def hold(hooks: HoldAfterAcquire, client: RebaserClient, change_set: ChangeSet) -> None:
    """Send ``change_set`` a request and wait until it is held in its cold path."""
    hooks.gates[change_set] = asyncio.Event()
    await client.enqueue_updates(
        change_set.workspace_id, change_set.change_set_id, [SetLiteral(path="/n", value=1)]
    )
    await wait_for(lambda: change_set in hooks.held, timeout=10, message="held after acquire")


async def unpulled(nc: NatsClient, settings: Settings, *, owned: int) -> bool:
    """One task stored and not delivered, ``owned`` delivered, and no pull request open. With slots free and no
    admission, the daemon keeps a pull open and the server hands a stored task to it at once."""
    s = settings.subjects
    info = await nc.jetstream().consumer_info(s.tasks_stream, s.tasks_consumer)
    return info.num_pending == 1 and info.num_waiting == 0 and info.num_ack_pending == owned


async def test_a_change_set_waits_in_the_server_while_others_start(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    hooks = HoldAfterAcquire()
    settings = fast_settings(
        subject_prefix, concurrency=10, start_concurrency=2, quiescent_period=300, intake="fifo"
    )
    async with running_daemon(nc, settings, RecordingApp(), hooks=hooks) as daemon:
        wk = WorkspacePk.new()
        first, second = ChangeSet(wk, ChangeSetId.new()), ChangeSet(wk, ChangeSetId.new())
        for cs in (first, second):  # two change sets held in their cold path: both still starting
            await hold(hooks, client, cs)
        third = asyncio.create_task(
            client.enqueue_updates_with_reply(
                wk, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=30
            )
        )
        await wait_for(
            lambda: unpulled(nc, settings, owned=2),
            timeout=10,
            message="the third task waits in the server, unpulled",
        )
        status = await daemon.status()
        assert status["owned"]["count"] == 2 and status["owned"]["starting"] == 2
        assert not third.done()

        hooks.gates[first].set()  # the first one gets its request: room for one more
        assert (await third).ok
        assert second in daemon.owned and daemon.starting == 1  # taken while the other was still starting
        hooks.gates[second].set()
        await wait_for(lambda: daemon.stats.requests_applied == 3, timeout=10, message="all three applied")
        assert daemon.starting == 0


async def test_a_wedged_first_request_does_not_hold_admission(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # One start slot, and a first request that never ends: the change set has started (its request arrived), so
    # the app being stuck in it keeps no other change set from being taken on.
    settings = fast_settings(
        subject_prefix, concurrency=10, start_concurrency=1, handler_deadline=60, intake="fifo"
    )
    app = RecordingApp()
    async with running_daemon(nc, settings, app) as daemon:
        wk = WorkspacePk.new()
        wedged = ChangeSet(wk, ChangeSetId.new())
        await client.enqueue_updates(wk, wedged.change_set_id, [SetLiteral(path="/hang", value=1)])
        await wait_for(lambda: app.active[str(wedged)] == 1, timeout=10, message="first request hangs")
        assert daemon.starting == 0
        reply = await client.enqueue_updates_with_reply(
            wk, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=30
        )
        assert reply.ok and app.active[str(wedged)] == 1


async def test_a_change_set_stuck_starting_holds_admission_for_ack_wait_at_most(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # One start slot, held by a change set whose cold path never ends: after ack_wait it counts as started.
    hooks = HoldAfterAcquire()
    settings = fast_settings(
        subject_prefix, concurrency=10, start_concurrency=1, quiescent_period=300, intake="fifo"
    )
    async with running_daemon(nc, settings, RecordingApp(), hooks=hooks) as daemon:
        wk = WorkspacePk.new()
        stuck = ChangeSet(wk, ChangeSetId.new())
        await hold(hooks, client, stuck)
        reply = await client.enqueue_updates_with_reply(
            wk, ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=30
        )
        assert reply.ok
        assert stuck in daemon.owned and not hooks.gates[stuck].is_set()  # still stuck, still owned
        hooks.gates[stuck].set()
        await wait_for(lambda: daemon.stats.requests_applied == 2, timeout=10, message="both applied")
