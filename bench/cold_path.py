"""The cold path: how long a change set's first reply takes when nothing is warm (docs/fair-share.md).

    .venv/bin/python -m bench.cold_path [--change-sets 60] [--workspaces 5] [--intake fair|fifo|lanes|default]
                                        [--rounds 2] [--json PATH]

One embedded nats-server (127.0.0.1, a free port, a file store) and one daemon at its defaults (``--intake``
aside: ``default`` leaves the layout's choice to the daemon); an idle daemon, then one client sends the first
request of ``--change-sets`` new change sets, one after another, spread over ``--workspaces`` workspaces, awaiting
each reply. Reported per run: the median, p90 and slowest first reply, and how many took 1 s or more (an intake that
missed the task's publish and found it only at its next look).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nats

from bench.procs import REPO, Processes
from rebaser_client import RebaserClient
from rebaser_core.api import SetLiteral
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, WorkspacePk

SLOW = 1.0


def _env(intake: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REBASER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    if intake != "default":
        env["REBASER_INTAKE"] = intake
    return env


async def one_run(args: argparse.Namespace, log_dir: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="rebaser-cold-") as store, Processes(log_dir) as procs:
        server = NatsServer(store_dir=Path(store) / "nats", host="127.0.0.1", die_with_parent=True)
        server.start()
        try:
            command = [sys.executable, "-m", "rebaser_server", "--nats-url", server.url]
            command += ["--http-port", "-1", "--log-level", os.environ.get("COLD_LOG_LEVEL", "WARNING")]
            daemon = procs.spawn("daemon", command, _env(args.intake))
            await procs.wait_ready(daemon, "rebaser daemon serving", timeout=60)
            nc = await nats.connect(server.url)
            try:
                async with RebaserClient(nc) as client:
                    workspaces = [WorkspacePk.new() for _ in range(args.workspaces)]
                    await asyncio.sleep(args.idle)  # an idle daemon: nothing pulled, nothing owned
                    took: list[float] = []
                    for n in range(args.change_sets):
                        wk = workspaces[n % len(workspaces)]
                        started = time.perf_counter()
                        reply = await client.enqueue_updates_with_reply(
                            wk, ChangeSetId.new(), [SetLiteral(path="/n", value=n)], timeout=30
                        )
                        took.append(time.perf_counter() - started)
                        assert reply.ok, reply
            finally:
                await nc.close()
            await procs.stop(daemon)
        finally:
            server.stop()
    took.sort()
    return {
        "median_ms": statistics.median(took) * 1000,
        "p90_ms": took[int(0.9 * (len(took) - 1))] * 1000,
        "max_ms": took[-1] * 1000,
        "slow": sum(t >= SLOW for t in took),
        "count": len(took),
    }


async def main_async(args: argparse.Namespace) -> list[dict[str, float]]:
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
        return [await one_run(args, args.logs) for _ in range(args.rounds)]
    with tempfile.TemporaryDirectory(prefix="rebaser-cold-logs-") as logs:
        return [await one_run(args, Path(logs)) for _ in range(args.rounds)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--change-sets", type=int, default=60)
    parser.add_argument("--workspaces", type=int, default=5)
    parser.add_argument("--intake", choices=("default", "fair", "fifo", "lanes"), default="default")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle", type=float, default=2.0, help="seconds the daemon is left idle first")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--logs", type=Path, default=None, help="keep the daemon's log here")
    args = parser.parse_args(argv)
    runs = asyncio.run(main_async(args))
    print(f"{args.change_sets} first replies over {args.workspaces} workspaces, intake {args.intake}")
    print("| run | median ms | p90 ms | slowest ms | 1 s or more |")
    print("|---|---|---|---|---|")
    for n, run in enumerate(runs, 1):
        print(
            f"| {n} | {run['median_ms']:.1f} | {run['p90_ms']:.1f} | {run['max_ms']:.1f} | "
            f"{run['slow']} of {run['count']} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": runs}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
