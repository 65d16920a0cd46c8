"""Instructions per request: the worker's work per request, counted by valgrind, which this machine's noise does not
move (single wall-clock runs differ by up to 40 %; perf has no counters here).

``python bench/instructions.py`` runs each implementation's one worker process (the rebaser daemon, or the
hand-written loop of ``bench/baseline.py``) under valgrind's callgrind, with counting off while it starts. Then:

1. **warm up**: every change set gets two requests, so each is owned, its consumer made, its code paths run;
2. **idle**: counting on for ``--idle`` seconds with no request: what the worker's timers cost per second (pulls
   that expire, lease renewals of the owned change sets, the baseline's per-change-set checks);
3. **measure**: counting on while ``--requests`` requests (``--clients`` at a time, each awaiting its reply) go to
   the change sets at random;

and reports instructions per request, ``(measured - idle rate x measured seconds) / requests``, and the ratio to
the hand-written loop's. The same seed gives the same plan, so two trees can be compared request for request (run
the script from each). Leases are long (``ack_wait`` 30 s, renewed every 5 s, as the hand-written loop's) and the
quiet period longer than the run, so nothing is released or taken over while counting: under valgrind everything
runs some fifty times slower.

Needs ``valgrind`` (with ``callgrind_control``) on the PATH; takes a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import nats

from bench.bench import Bench, parse_args, tempfile_dir
from bench.deployment import Deployment
from bench.procs import Processes
from bench.workload import drive
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId

_TOTALS = re.compile(rb"^totals:\s+(\d+)", re.MULTILINE)


class Counter:
    """Callgrind's instruction count of one process, switched on and off from outside (``callgrind_control``)."""

    def __init__(self, pid: int, out_dir: Path) -> None:
        self.pid = pid
        self.out_dir = out_dir

    async def _control(self, *args: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            "callgrind_control", *args, str(self.pid), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        output, _ = await proc.communicate()
        if proc.returncode != 0 or b"OK" not in output:
            raise RuntimeError(
                f"callgrind_control {' '.join(args)} {self.pid}: {output.decode(errors='replace')}"
            )

    async def count(self, work: asyncio.Future[object] | None, seconds: float = 0.0) -> tuple[int, float]:
        """Instructions executed while ``work`` runs (or for ``seconds``), and for how long."""
        await self._control("--zero")
        await self._control("--instr=on")
        began = time.perf_counter()
        if work is not None:
            await work
        else:
            await asyncio.sleep(seconds)
        took = time.perf_counter() - began
        await self._control("--instr=off")
        before = set(self.out_dir.glob(f"cg.{self.pid}.*"))
        await self._control("--dump")
        dumps = set(self.out_dir.glob(f"cg.{self.pid}.*")) - before
        if len(dumps) != 1:
            raise RuntimeError(f"expected one new callgrind dump in {self.out_dir}, found {sorted(dumps)}")
        match = _TOTALS.search(dumps.pop().read_bytes())
        if match is None:
            raise RuntimeError("callgrind dump without a totals line")
        return int(match.group(1)), took


async def measure(bench: Bench, impl: str, args: argparse.Namespace, out_dir: Path) -> dict[str, float]:
    nc = await nats.connect(bench.server.url)
    dep = Deployment(bench, impl, 1)
    try:
        await dep.start(nc)
        counter = Counter(dep.procs[0].pid, out_dir)
        change_sets = [ChangeSetId.new() for _ in range(args.change_sets)]
        rng = random.Random(args.seed)
        plan = [rng.randrange(args.change_sets) for _ in range(args.requests)]

        async def send(i: int, c: int) -> bool:
            return await dep.send(change_sets[c], i)

        warm = await drive(send, [c for c in range(args.change_sets) for _ in range(2)], args.change_sets)
        if warm.errors:
            raise RuntimeError(f"{impl}: warm-up failed: {warm.errors[:3]}")
        idle, idle_s = await counter.count(None, args.idle)
        work = asyncio.ensure_future(drive(send, plan, args.clients))
        total, took = await counter.count(work)
        if work.result().errors:
            raise RuntimeError(
                f"{impl}: {len(work.result().errors)} requests failed: {work.result().errors[:3]}"
            )
    finally:
        await dep.stop(nc)
        await nc.close()
    idle_rate = idle / idle_s
    per_request = (total - idle_rate * took) / args.requests
    return {
        "per_request": per_request,
        "raw": total / args.requests,
        "idle_per_s": idle_rate,
        "seconds": took,
    }


async def main_async(args: argparse.Namespace, server: NatsServer, procs: Processes, out_dir: Path) -> int:
    bench_args = parse_args(["--quiescent", "3600"])
    bench = Bench(bench_args, server, procs)
    bench.env["REBASER_ACK_WAIT"] = "30"
    bench.env["REBASER_PROGRESS_PERIOD"] = "5"
    bench.wrap = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out_dir}/cg.%p",
    ]
    bench.ready_timeout = 600.0
    results: dict[str, dict[str, float]] = {}
    for impl in [i.strip() for i in args.impl.split(",") if i.strip()]:
        print(f"[{time.strftime('%H:%M:%S')}] {impl}: starting under valgrind", flush=True)
        results[impl] = r = await measure(bench, impl, args, out_dir)
        print(
            f"    {r['per_request'] / 1e6:.3f} M instructions per request ({r['raw'] / 1e6:.3f} M before taking off "
            f"{r['idle_per_s'] / 1e6:.1f} M/s of idle work over {r['seconds']:.0f} s)",
            flush=True,
        )
    base = results.get("baseline")
    print(
        f"\n{args.requests} requests on {args.change_sets} warm change sets, {args.clients} clients, seed {args.seed}"
    )
    for impl, r in results.items():
        ratio = ""
        if base is not None and impl != "baseline":
            ratio = f"  {r['per_request'] / base['per_request']:.2f}x the hand-written loop"
        print(f"  {impl:>9}: {r['per_request'] / 1e6:6.3f} M instructions per request{ratio}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--impl", default="baseline,rebaser", help="comma-separated: baseline, rebaser, snapshots"
    )
    parser.add_argument("--change-sets", type=int, default=20)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of the idle count")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--logs", type=Path, default=None, help="keep logs and callgrind dumps here")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("needs valgrind and callgrind_control on the PATH", file=sys.stderr)
        return 2
    with tempfile_dir(args.logs) as tmp, NatsServer(host="127.0.0.1") as server, Processes(tmp) as procs:
        print(f"nats-server pid {server.pid} at {server.url}; logs and dumps in {tmp}")
        return asyncio.run(main_async(args, server, procs, tmp))


if __name__ == "__main__":
    sys.exit(main())
