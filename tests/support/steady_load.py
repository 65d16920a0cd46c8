"""A steady load from the host for the container kill tests: change sets that each send requests one after
another, every request setting a path of its own, so that an acknowledged request that was lost shows as a
missing path, and ``/last`` shows the order they were applied in."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from rebaser_client import RebaserBusy, RebaserClient, RebaserTimeout, RebaserUnavailable, SetLiteral
from rebaser_core.api import EnqueueUpdatesRequest, InlineUpdates
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk

# A request waits for its reply this long per try; a daemon's or a node's loss stalls its change sets for
# ack_wait (2.5 s) plus a leader election, far less.
REPLY_TIMEOUT = 30.0
# One request gives up (and the load fails) after this long, its tries together.
GIVE_UP = 90.0


@dataclass
class SteadyLoad:
    client: RebaserClient
    change_sets: int = 6
    workspace: WorkspacePk = field(default_factory=WorkspacePk.new)
    acknowledged: dict[ChangeSetId, list[int]] = field(default_factory=dict)
    resent: int = 0  # tries after an ambiguous failure, with the same request id: the stream stores one copy
    slowest: float = 0.0  # the longest any one request took to be acknowledged, its tries together
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.acknowledged = {ChangeSetId.new(): [] for _ in range(self.change_sets)}

    @property
    def total(self) -> int:
        return sum(map(len, self.acknowledged.values()))

    def each_at_least(self, count: int) -> bool:
        return all(len(done) >= count for done in self.acknowledged.values())

    def start(self) -> None:
        self._stopping.clear()
        self._tasks = [asyncio.create_task(self._send(cs)) for cs in self.acknowledged]

    async def stop(self) -> None:
        """Let every change set finish the request in hand, then stop; a failed one raises here."""
        self._stopping.set()
        try:
            async with asyncio.timeout(GIVE_UP + 10):
                await asyncio.gather(*self._tasks)
        finally:
            for task in self._tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _send(self, cs: ChangeSetId) -> None:
        loop = asyncio.get_running_loop()
        done = self.acknowledged[cs]
        while not self._stopping.is_set():
            n = len(done)
            updates = [SetLiteral(path=f"/r{n}", value=n), SetLiteral(path="/last", value=n)]
            request = EnqueueUpdatesRequest(
                id=RequestId.new(),
                workspace_id=self.workspace,
                change_set_id=cs,
                updates=InlineUpdates(updates=updates),
            )
            started = loop.time()
            while True:
                try:
                    reply = await self.client.send(request, timeout=REPLY_TIMEOUT)
                    break
                except (RebaserUnavailable, RebaserBusy, RebaserTimeout):
                    if loop.time() - started > GIVE_UP:
                        raise
                    self.resent += 1
                    await asyncio.sleep(0.2)  # a pause between tries, bounded by GIVE_UP above
            assert reply is not None and reply.ok, reply
            self.slowest = max(self.slowest, loop.time() - started)
            done.append(n)

    async def lost(self) -> list[str]:
        """What is wrong with the change sets now: an acknowledged request whose update is not there (lost), or a
        ``/last`` that is not the last acknowledged request (applied out of order). Empty when nothing is."""
        wrong: list[str] = []
        for cs, done in self.acknowledged.items():
            got = await self.client.get_change_set(self.workspace, cs, timeout=30)
            missing = [n for n in done if got.values.get(f"/r{n}") != n]
            if missing:
                wrong.append(f"{cs}: acknowledged but missing: {missing}")
            if done and got.values.get("/last") != done[-1]:
                wrong.append(f"{cs}: /last is {got.values.get('/last')}, the last acknowledged {done[-1]}")
        return wrong
