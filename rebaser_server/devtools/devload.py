"""Demo load for ``rebaser-server dev-cluster --demo``: a steady stream of requests, to watch a local cluster serve them
and keep serving them while daemons are killed and restarted.

A few change sets of one workspace each get one request at a time (a counter and a function of it, so dependent
values are recomputed). Every few seconds one line sums up the interval: replies, conflicts, errors, timeouts and
the latency of the replies. It only uses the client: what it sees is what any application would see.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rebaser_client import RebaserClient
from rebaser_core.api import SetFunction, SetLiteral, Update
from rebaser_core.errors import RebaserError, RebaserTimeout
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.connect import ConnectOptions

__all__ = ["run_load"]

_STOP_WAIT = 5.0
REPLY_TIMEOUT = 30.0  # longer than a takeover after a daemon's death (ack_wait), so a kill shows as latency


@dataclass
class _Interval:
    replies: int = 0
    conflicts: int = 0
    errors: int = 0
    timeouts: int = 0
    latencies: list[float] = field(default_factory=list)
    last_error: str = ""

    def line(self, seconds: float) -> str:
        text = (
            f"load: {self.replies} replies in {seconds:.0f} s ({self.replies / max(seconds, 1e-9):.0f}/s), "
            f"{self.conflicts} conflicts, {self.errors} errors, {self.timeouts} timeouts"
        )
        if self.latencies:
            ordered = sorted(self.latencies)
            p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
            text += f", latency p50 {statistics.median(ordered) * 1000:.0f} ms p99 {p99 * 1000:.0f} ms"
        if self.last_error:
            text += f" (last error: {self.last_error})"
        return text


async def _change_set_traffic(
    client: RebaserClient,
    workspace: WorkspacePk,
    pace: float,
    tally: Callable[[], _Interval],
    stopping: asyncio.Event,
) -> None:
    change_set = ChangeSetId.new()
    n = 0
    # A stop flag besides the cancellation: a NATS answer (asyncio.wait_for, Python 3.11) can swallow it, and the
    # load would then never stop.
    while not stopping.is_set():
        n += 1
        started = time.monotonic()
        updates: list[Update] = [
            SetLiteral(path="/load/counter", value=n),
            SetFunction(path="/load/double", function="sum", args=["/load/counter", "/load/counter"]),
        ]
        try:
            reply = await client.enqueue_updates_with_reply(
                workspace, change_set, updates, timeout=REPLY_TIMEOUT
            )
        except RebaserTimeout:
            tally().timeouts += 1
        except RebaserError as err:  # refused or unreachable: counted, and the load goes on
            tally().errors += 1
            tally().last_error = f"{type(err).__name__}: {err}"
        else:
            interval = tally()
            interval.replies += 1
            interval.conflicts += reply.status.kind == "conflicts"
            interval.errors += reply.status.kind == "error"
            interval.latencies.append(time.monotonic() - started)
        await asyncio.sleep(pace)  # a demo, not a benchmark: leave the machine to the cluster


async def run_load(
    urls: Sequence[str],
    echo: Callable[[str], None],
    *,
    prefix: str | None = None,
    change_sets: int = 6,
    pace: float = 0.2,
    report_every: float = 5.0,
) -> None:
    """Send the load until cancelled, printing a line with ``echo`` every ``report_every`` seconds. ``prefix``: the
    deployment's subject prefix (the daemons')."""
    options = ConnectOptions(servers=tuple(urls), name="rebaser-dev-load")
    async with await RebaserClient.connect(options, prefix=prefix) as client:
        current = _Interval()
        workspace = WorkspacePk.new()
        stopping = asyncio.Event()
        workers = [
            asyncio.create_task(_change_set_traffic(client, workspace, pace, lambda: current, stopping))
            for _ in range(change_sets)
        ]
        echo(f"load: {change_sets} change sets of workspace {workspace}, one request at a time each")
        try:
            while True:
                since = time.monotonic()
                await asyncio.sleep(report_every)
                done, current = current, _Interval()
                echo(done.line(time.monotonic() - since))
        finally:
            stopping.set()
            for worker in workers:
                worker.cancel()
            # Bounded: a worker still in a request ends with it, or when the client closes below.
            if workers:
                await asyncio.wait(workers, timeout=_STOP_WAIT)
