"""Scale-out benchmark: N shards vs one stream on a local 3-node JetStream cluster (R3, file storage).

Run from the repository root::

    python bench/shards.py                  # streams 1 and 3, both phases (about a minute)
    python bench/shards.py --streams 1 3 6 --requests 3000 --json out.json
    GOMAXPROCS=1 python bench/shards.py --repeat 3   # each nats-server on one core; medians of 3 interleaved runs

``GOMAXPROCS=1`` (inherited by the nats-servers) models a cluster whose servers each have a core of their own,
which is what sharding is for; without it, on a small machine every server may use every core and one stream's
leader is not the bottleneck. The busiest server's CPU per request is the figure sharding lowers: it bounds what
one server can serve, and with one stream that server does the leader's work for every request.

A fresh 3-node cluster (loopback, temporary stores) is started here and stopped at the end. Per number of streams N,
with its own subject prefix and the shards' leaders spread over the three servers (``spread_leaders``):

- **enqueue**: the JetStream side alone. ``--clients`` coroutines over three connections (one per server) enqueue
  requests (request publish + task publish, both acknowledged by R3 streams) to ``--change-sets`` change sets; no
  daemon runs. This is what one stream's leader caps: every write of the deployment goes through it.
- **end-to-end**: three daemons (``python -m rebaser_server --streams N``, the minimal counter app, one per server)
  and requests *with replies*, the same clients and plan.

Columns: req/s, p50/p99 latency, and CPU seconds per 1,000 requests of the three nats-servers, of the daemons and of
this process (the client), so the limit shows: on a 2-core machine every process shares the same two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path[0] = str(REPO)

from bench.procs import Processes, cpu_seconds  # noqa: E402
from bench.workload import drive, percentile  # noqa: E402
from rebaser_client import RebaserClient  # noqa: E402
from rebaser_core.api import SetLiteral, SuccessStatus  # noqa: E402
from rebaser_core.embedded import NatsCluster  # noqa: E402
from rebaser_core.ids import ChangeSetId, WorkspacePk  # noqa: E402
from rebaser_core.nats.layout_store import init_layout  # noqa: E402
from rebaser_core.nats.shard_info import spread_leaders  # noqa: E402
from rebaser_core.nats.streams import ensure_streams  # noqa: E402
from rebaser_core.settings import Settings  # noqa: E402

APP = "rebaser_server.apps.counter:CounterApp"


async def _set_up(url: str, prefix: str, streams: int) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=10)
        settings = Settings(prefix=prefix, replicas=3, storage="file", streams=streams)
        await init_layout(js, settings.subjects, streams=streams, mode=None, who="bench", replicas=3)
        await ensure_streams(js, settings, shards=range(streams), streams=streams)
        await spread_leaders(nc, js, settings.subjects, range(streams))
        await asyncio.sleep(2.0)  # leader elections after the step-downs
    finally:
        await nc.close()


async def run(
    args: argparse.Namespace, cluster: NatsCluster, procs: Processes, streams: int
) -> dict[str, Any]:
    prefix = f"s{streams}x{secrets.token_hex(3)}"
    await _set_up(cluster.urls[0], prefix, streams)
    conns = [await nats.connect(servers=[url], max_reconnect_attempts=-1) for url in cluster.urls]
    clients = [RebaserClient(nc, prefix=prefix, max_in_flight=4096) for nc in conns]
    for client in clients:
        await client.start()
    wk = WorkspacePk.new()
    change_sets = [ChangeSetId.new() for _ in range(args.change_sets)]
    rng = random.Random(args.seed)
    plan = [rng.randrange(len(change_sets)) for _ in range(args.requests)]
    server_pids = [n.pid or 0 for n in cluster.nodes]
    out: dict[str, Any] = {"streams": streams}
    daemons = []
    try:

        async def enqueue(i: int, c: int) -> bool:
            await clients[i % 3].enqueue_updates(wk, change_sets[c], [SetLiteral(path="/n", value=i)])
            return True

        async def request(i: int, c: int) -> bool:
            updates = [SetLiteral(path="/n", value=i)]
            reply = await clients[i % 3].enqueue_updates_with_reply(wk, change_sets[c], updates, timeout=60)
            return isinstance(reply.status, SuccessStatus)

        for phase, send in (("enqueue", enqueue), ("end_to_end", request)):
            if phase == "end_to_end":
                env = {k: v for k, v in os.environ.items() if not k.startswith("REBASER_")}
                env["PYTHONPATH"] = str(REPO)
                env["REBASER_CONCURRENCY"] = "2000"
                env["REBASER_QUIESCENT_PERIOD"] = "5"
                for i, url in enumerate(cluster.urls):
                    cmd = [sys.executable, "-m", "rebaser_server", "--nats-url", url, "--prefix", prefix]
                    cmd += [
                        "--app",
                        APP,
                        "--log-level",
                        "WARNING",
                        "--http-port",
                        "-1",
                        "--streams",
                        str(streams),
                    ]
                    daemons.append(procs.spawn(f"{prefix}-daemon{i}", cmd, env))
                for proc in daemons:
                    await procs.wait_ready(proc, "rebaser daemon serving")
                # Warm up: the queued requests of the enqueue phase are applied first, then a few more.
                warm = await drive(send, plan[: min(300, len(plan))], args.clients)
                if warm.errors:
                    raise RuntimeError(f"warm-up failed: {warm.errors[:3]}")
            pids = {"nats": server_pids, "daemons": [p.pid for p in daemons], "client": [os.getpid()]}
            before = {k: sum(map(cpu_seconds, v)) for k, v in pids.items()}
            per_server = [cpu_seconds(pid) for pid in server_pids]
            measured = await drive(send, plan, args.clients)
            after = {k: sum(map(cpu_seconds, v)) for k, v in pids.items()}
            per_server = [cpu_seconds(pid) - b for pid, b in zip(server_pids, per_server, strict=True)]
            done = len(measured.latencies)
            lat = sorted(x * 1000 for x in measured.latencies)
            out[phase] = {
                "rps": round(done / measured.seconds, 1),
                "errors": len(measured.errors),
                "first_errors": sorted(set(measured.errors))[:3],
                "p50_ms": round(percentile(lat, 0.5), 2),
                "p99_ms": round(percentile(lat, 0.99), 2),
                "cpu_s_per_1k": {k: round((after[k] - before[k]) / max(done, 1) * 1000, 3) for k in before},
                # The busiest nats-server's CPU per 1,000 requests: what bounds throughput when each server has
                # cores of its own (one stream puts its leader's work on one server).
                "busiest_server_cpu_s_per_1k": round(max(per_server) / max(done, 1) * 1000, 3),
                "server_cpu_share": [round(c / max(sum(per_server), 1e-9), 2) for c in per_server],
            }
    finally:
        for proc in daemons:
            await procs.stop(proc)
        for client in clients:
            await client.close()
        for nc in conns:
            await nc.close()
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, nargs="+", default=[1, 3])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--change-sets", type=int, default=300)
    p.add_argument("--clients", type=int, default=96)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds over --streams, interleaved (1 3 1 3 ...); the summary shows medians (a shared machine is noisy)",
    )
    return p.parse_args(argv)


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="rebaser-shards-bench-") as tmp:
        cluster = NatsCluster(3, base_dir=Path(tmp))
        await asyncio.to_thread(cluster.start)
        try:
            with Processes(Path(tmp)) as procs:
                results = []
                for streams in [n for _ in range(args.repeat) for n in args.streams]:
                    started = time.monotonic()
                    result = await run(args, cluster, procs, streams)
                    result["seconds"] = round(time.monotonic() - started, 1)
                    print(json.dumps(result), flush=True)
                    results.append(result)
                return results
        finally:
            await asyncio.to_thread(cluster.stop)


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result per N: the median of each figure the summary shows."""
    out: dict[str, Any] = {"streams": runs[0]["streams"]}
    for phase in ("enqueue", "end_to_end"):
        out[phase] = {
            key: statistics.median(r[phase][key] for r in runs)
            for key in ("rps", "busiest_server_cpu_s_per_1k")
        }
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = asyncio.run(main_async(args))
    results = [_median([r for r in runs if r["streams"] == n]) for n in args.streams]
    base = results[0]
    print(f"\nmedians of {args.repeat} run(s) each")
    print(
        f"\n{'streams':>7} {'enqueue req/s':>14} {'ratio':>6} {'end-to-end req/s':>17} {'ratio':>6}"
        f" {'busiest server CPU ms/req (enqueue, e2e)':>42}"
    )
    for r in results:
        e, x = r["enqueue"]["rps"], r["end_to_end"]["rps"]
        be, bx = r["enqueue"]["busiest_server_cpu_s_per_1k"], r["end_to_end"]["busiest_server_cpu_s_per_1k"]
        print(
            f"{r['streams']:>7} {e:>14} {e / base['enqueue']['rps']:>6.2f} {x:>17} "
            f"{x / base['end_to_end']['rps']:>6.2f} {be:>20} {bx:>21}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": runs, "medians": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
