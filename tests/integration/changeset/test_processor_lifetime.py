"""A change set let go is freed at once, by reference counting, not left for the cycle collector.

Each activation's processor, with its consumer, DVU loop and commit group, must not be held in reference cycles
(the DVU loop and the processor hold each other's methods until the ownership ends): in a burst of new change sets
all of it would wait for the collector, whose walks over it cost a tenth of the daemon's CPU and raise its peak
memory by a fifth. With the collector switched off, every processor must still be gone once its change set is
released.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet, RebaserApp
from rebaser_server.apps.counter import CounterApp
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.changeset.hooks import Hooks
from rebaser_server.changeset.processor import ChangeSetProcessor
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.testing import fast_settings, running_daemon

_CHANGE_SETS = 6


class _Processors(Hooks):
    """Weak references to each change set's processor, taken when it has acquired the record (it is owned then)."""

    def __init__(self) -> None:
        self.daemon: Daemon | None = None
        self.refs: list[weakref.ref[ChangeSetProcessor]] = []

    async def checkpoint(self, name: str, change_set: ChangeSet) -> None:
        if name == "acquired" and self.daemon is not None:
            self.refs += [
                weakref.ref(p) for p in self.daemon._owned.processors() if p.change_set == change_set
            ]


@pytest.mark.parametrize("app", [CounterApp, SnapshotApp], ids=["counter", "snapshots"])
async def test_a_released_change_set_is_freed_without_the_cycle_collector(
    nc: NatsClient,
    client: RebaserClient,
    subject_prefix: str,
    app: type[RebaserApp],
    no_cycle_collector: None,
) -> None:
    settings = fast_settings(subject_prefix)
    processors = _Processors()
    async with running_daemon(nc, settings, app(), hooks=processors) as daemon:
        processors.daemon = daemon
        wk = WorkspacePk.new()
        responses = await asyncio.gather(
            *(
                client.enqueue_updates_with_reply(
                    wk, ChangeSetId.new(), [SetLiteral(path="/x", value=1)], timeout=30
                )
                for _ in range(_CHANGE_SETS)
            )
        )
        assert all(response.ok for response in responses)
        assert len(processors.refs) == _CHANGE_SETS
        await wait_for(
            lambda: daemon.stats.tasks_released >= _CHANGE_SETS, timeout=30, message="all released"
        )
        await wait_for(lambda: not len(daemon._owned), timeout=10, message="every owning task ended")
        await wait_for(
            lambda: all(ref() is None for ref in processors.refs),
            timeout=10,
            message="every processor freed by reference counting",
        )
        assert gc.isenabled() is False
