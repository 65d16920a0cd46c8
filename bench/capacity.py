"""What an owned, idle change set costs a cluster: the per-operation figures docs/capacity.md builds its model on.

Run from the repository root::

    python bench/capacity.py                        # 1 and 3 shards, 500 and 2,000 change sets (about 3 minutes)
    python bench/capacity.py --shards 1 3 9 --held 1000 --window 10 --json out.json
    python bench/capacity.py --lease-mode daemon   # one heartbeat per daemon (docs/capacity.md)

A fresh 3-node JetStream cluster (loopback, file storage, R3 streams, temporary stores) is started here and stopped
at the end. Per number of shards S and number of change sets N, with its own subject prefix, the shards' leaders
spread over the servers (``spread_leaders``) and three daemons (the counter app, one per server, ``concurrency``
above N, the quiescent period longer than the run):

1. after ``--settle`` seconds, a window of ``--window`` seconds with nothing owned: the baseline;
2. one request to each of N fresh change sets (each then owned, idle);
3. the same window with the N change sets held.

Reported per held change set: CPU a second of the three nats-servers (all, and the busiest one) and of the daemons
(the difference of the two windows), and resident memory (the difference of the two ends). Each held change set's
lease is renewed every ``progress_period`` (0.5 s): two confirmed progress acks a second. Two sizes N show whether
the cost is linear in N.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

import nats

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path[0] = str(REPO)

from bench.procs import Processes, cpu_seconds, rss_kb  # noqa: E402
from bench.shards import APP, _set_up  # noqa: E402
from bench.workload import drive  # noqa: E402
from rebaser_client import RebaserClient  # noqa: E402
from rebaser_core.api import SetLiteral, SuccessStatus  # noqa: E402
from rebaser_core.embedded import NatsCluster  # noqa: E402
from rebaser_core.ids import ChangeSetId, WorkspacePk  # noqa: E402


async def held_cost(
    args: argparse.Namespace, cluster: NatsCluster, procs: Processes, shards: int, held: int
) -> dict[str, Any]:
    prefix = f"c{shards}{args.lease_mode[0]}x{secrets.token_hex(3)}"
    await _set_up(cluster.urls[0], prefix, shards)
    nc = await nats.connect(servers=cluster.urls, max_reconnect_attempts=-1)
    client = RebaserClient(nc, prefix=prefix, max_in_flight=4096)
    await client.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REBASER_")}
    env.update(
        PYTHONPATH=str(REPO),
        REBASER_CONCURRENCY=str(held + 100),
        REBASER_QUIESCENT_PERIOD=str(10 * args.window + 120),
        REBASER_LEASE_MODE=args.lease_mode,
    )
    daemons = []
    servers = [n.pid or 0 for n in cluster.nodes]
    try:
        for i, url in enumerate(cluster.urls):
            cmd = [
                sys.executable,
                "-m",
                "rebaser_server",
                "--nats-url",
                url,
                "--prefix",
                prefix,
                "--app",
                APP,
            ]
            cmd += ["--log-level", "WARNING", "--http-port", "-1", "--streams", str(shards)]
            daemons.append(procs.spawn(f"{prefix}-daemon{i}", cmd, env))
        for proc in daemons:
            await procs.wait_ready(proc, "rebaser daemon serving")
        pids = [p.pid for p in daemons]
        wk, change_sets = WorkspacePk.new(), [ChangeSetId.new() for _ in range(held)]

        async def send(i: int, c: int) -> bool:
            updates = [SetLiteral(path="/n", value=i)]
            reply = await client.enqueue_updates_with_reply(wk, change_sets[c], updates, timeout=60)
            return isinstance(reply.status, SuccessStatus)

        await asyncio.sleep(args.settle)  # start-up's elections and consumer creations are over
        empty = await _window(args.window, servers, pids)
        taken = await drive(send, list(range(held)), args.clients)
        full = await _window(args.window, servers, pids)
    finally:
        for proc in daemons:
            await procs.stop(proc)
        await client.close()
        await nc.close()

    def per(key: str, scale: float) -> float:
        return round((full[key] - empty[key]) * scale / held, 2)

    return {
        "shards": shards,
        "held": held,
        "errors": len(taken.errors),
        "servers_cpu_us_per_s": per("servers_cpu", 1e6 / args.window),
        "busiest_server_cpu_us_per_s": round(
            max(f - e for f, e in zip(full["per_server"], empty["per_server"], strict=True))
            * 1e6
            / args.window
            / held,
            2,
        ),
        "daemons_cpu_us_per_s": per("daemons_cpu", 1e6 / args.window),
        "servers_rss_kb": per("servers_rss", 1.0),
        "daemons_rss_kb": per("daemons_rss", 1.0),
    }


async def _window(seconds: float, servers: list[int], daemons: list[int]) -> dict[str, Any]:
    """CPU used by the servers and the daemons over ``seconds``, and their memory at the end."""
    before = [cpu_seconds(p) for p in servers], sum(map(cpu_seconds, daemons))
    await asyncio.sleep(seconds)
    per_server = [cpu_seconds(p) - b for p, b in zip(servers, before[0], strict=True)]
    return {
        "per_server": per_server,
        "servers_cpu": sum(per_server),
        "daemons_cpu": sum(map(cpu_seconds, daemons)) - before[1],
        "servers_rss": sum(map(rss_kb, servers)),
        "daemons_rss": sum(map(rss_kb, daemons)),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, nargs="+", default=[1, 3])
    p.add_argument("--held", type=int, nargs="+", default=[500, 2000], help="change sets held idle")
    p.add_argument("--window", type=float, default=10.0, help="seconds measured, with and without them held")
    p.add_argument(
        "--settle", type=float, default=5.0, help="seconds waited after start-up, before measuring"
    )
    p.add_argument("--clients", type=int, default=64)
    p.add_argument(
        "--lease-mode",
        choices=["task", "daemon"],
        default="task",
        help="the daemons' lease_mode: a renewal per owned change set, or one heartbeat per daemon",
    )
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="rebaser-capacity-") as tmp:
        cluster = NatsCluster(3, base_dir=Path(tmp))
        await asyncio.to_thread(cluster.start)
        try:
            with Processes(Path(tmp)) as procs:
                results = []
                for shards in args.shards:
                    for held in args.held:
                        result = await held_cost(args, cluster, procs, shards, held)
                        print(json.dumps(result), flush=True)
                        results.append(result)
                return results
        finally:
            await asyncio.to_thread(cluster.stop)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = asyncio.run(main_async(args))
    print(
        f"\n{'shards':>6} {'held':>6} {'errors':>6} {'servers µs/s':>13} {'busiest µs/s':>13} "
        f"{'daemons µs/s':>13} {'servers kB':>11} {'daemons kB':>11}   (per held change set)"
    )
    for r in results:
        print(
            f"{r['shards']:>6} {r['held']:>6} {r['errors']:>6} {r['servers_cpu_us_per_s']:>13} "
            f"{r['busiest_server_cpu_us_per_s']:>13} {r['daemons_cpu_us_per_s']:>13} {r['servers_rss_kb']:>11} "
            f"{r['daemons_rss_kb']:>11}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
