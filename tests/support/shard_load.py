"""Helpers of the shard tests: a load of many change sets with an order check per change set."""

from __future__ import annotations

import asyncio

import nats.errors

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.layout import shard_of
from rebaser_core.testing import wait_for
from rebaser_server.record.store import ChangeSetStore
from tests.support.apps import applied


class Load:
    """Change sets of one workspace, each sent requests in order; ``check`` waits until every one is applied in
    exactly the order it was sent (nothing lost, nothing twice, nothing out of order)."""

    def __init__(self, change_sets: int, *, every_shard_of: int = 1) -> None:
        """``every_shard_of``: pick the change sets so that each of that many shards gets at least one (at random,
        12 change sets miss one of 3 shards in about 1 % of runs, and a test that needs every shard busy fails)."""
        self.workspace = WorkspacePk.new()
        self.change_sets = []
        for shard in range(min(every_shard_of, change_sets)):
            while shard_of(self.workspace, cs := ChangeSetId.new(), every_shard_of) != shard:
                pass
            self.change_sets.append(cs)
        self.change_sets += [ChangeSetId.new() for _ in range(change_sets - len(self.change_sets))]
        self.sent: dict[ChangeSetId, list[str]] = {cs: [] for cs in self.change_sets}

    @property
    def count(self) -> int:
        """Requests sent (acknowledged) so far."""
        return sum(len(ids) for ids in self.sent.values())

    async def started(self, at_least: int, timeout: float = 30.0) -> None:
        """Wait until ``at_least`` requests are in: a fault meant to strike mid-load strikes after them."""
        await wait_for(lambda: self.count >= at_least, timeout=timeout, message=f"{at_least} requests sent")

    async def send(self, client: RebaserClient, per_change_set: int, pause: float = 0.0) -> None:
        async def produce(cs: ChangeSetId) -> None:
            for i in range(per_change_set):
                rid = await client.enqueue_updates(self.workspace, cs, [SetLiteral(path="/n", value=i)])
                self.sent[cs].append(str(rid))
                if pause:
                    await asyncio.sleep(pause)

        await asyncio.gather(*(produce(cs) for cs in self.change_sets))

    async def check(self, store: ChangeSetStore, timeout: float = 60.0) -> None:
        for cs in self.change_sets:

            async def complete(cs: ChangeSetId = cs) -> bool:
                return len(await applied(store, self.workspace, cs)) >= len(self.sent[cs])

            # A record read may time out while its bucket's leader is being elected (a node killed): look again.
            await wait_for(
                complete,
                timeout=timeout,
                interval=0.05,
                message=f"all requests of {cs} applied",
                retry_on=(TimeoutError, nats.errors.Error),
            )
            assert await applied(store, self.workspace, cs) == self.sent[cs], f"order of {cs}"
