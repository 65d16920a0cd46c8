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

``--cold N`` counts the cold path instead (the burst's work): warm-up and measure each send one request to fresh
change sets (``N`` of them, all at once, in the measure, begun once counting is on), and the count runs until
every one is released again (its consumer gone, its task acked), with a quiet period of one second. It reports
instructions per activation (take the task, read and write the record, create the consumer, apply and reply,
release). Only ``--side worker``. The hand-written loop's figure is not comparable: it leaves its consumers for the
server to reap, so its count runs on until they expire. (nats-server's CPU per activation, read beside it, moved
by a third from run to run; ``bench/server_ops.py`` measures the server's side per operation instead.)

``--side client`` counts the client instead: the daemon or worker runs natively, and the load comes from a process
of its own under callgrind (``RebaserClient``, or the hand-written loop's client), counted the same way.

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
from collections.abc import Awaitable, Callable
from pathlib import Path

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import nats

from bench.bench import Bench, tempfile_dir
from bench.deployment import Deployment
from bench.options import parse_args
from bench.procs import Processes
from bench.workload import drive
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId

_SCRIPT = Path(__file__).resolve()
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

    async def count(
        self,
        work: asyncio.Future[object] | None,
        seconds: float = 0.0,
        start: Callable[[], Awaitable[object]] | None = None,
    ) -> tuple[int, float]:
        """Instructions executed while ``work`` runs (or ``start()``, begun once counting is on; or for
        ``seconds``), and for how long."""
        await self._control("--zero")
        await self._control("--instr=on")
        began = time.perf_counter()
        if start is not None:
            await start()
        elif work is not None:
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


def _plan(args: argparse.Namespace) -> tuple[list[ChangeSetId], list[int]]:
    change_sets = [ChangeSetId.new() for _ in range(args.change_sets)]
    rng = random.Random(args.seed)
    return change_sets, [rng.randrange(args.change_sets) for _ in range(args.requests)]


async def _warm_up(dep: Deployment, args: argparse.Namespace, change_sets: list[ChangeSetId]) -> None:
    async def send(i: int, c: int) -> bool:
        return await dep.send(change_sets[c], i)

    warm = await drive(send, [c for c in range(args.change_sets) for _ in range(2)], args.change_sets)
    if warm.errors:
        raise RuntimeError(f"{dep.impl}: warm-up failed: {warm.errors[:3]}")


async def _load(
    dep: Deployment, args: argparse.Namespace, change_sets: list[ChangeSetId], plan: list[int]
) -> None:
    async def send(i: int, c: int) -> bool:
        return await dep.send(change_sets[c], i)

    done = await drive(send, plan, args.clients)
    if done.errors:
        raise RuntimeError(f"{dep.impl}: {len(done.errors)} requests failed: {done.errors[:3]}")


async def _activate(dep: Deployment, nc: nats.NATS, count: int) -> None:
    """One request to each of ``count`` fresh change sets, all at once; done once every one was released."""
    change_sets = [ChangeSetId.new() for _ in range(count)]

    async def send(i: int, c: int) -> bool:
        return await dep.send(change_sets[c], i)

    done = await drive(send, list(range(count)), count)
    if done.errors:
        raise RuntimeError(f"{dep.impl}: {len(done.errors)} requests failed: {done.errors[:3]}")
    # Released: consumer deleted and task acked (the acked task leaves the work queue). Only the "anything queued?"
    # checks of the last few releases can still be under way.
    tasks_stream = dep.streams[1]
    async with asyncio.timeout(600):
        while True:  # polled: the server announces neither; -1 (no answer in time) asks again
            if (
                await dep.consumers(nc) == 0
                and (await nc.jetstream().stream_info(tasks_stream)).state.messages == 0
            ):
                break
            await asyncio.sleep(0.1)


async def measure(bench: Bench, impl: str, args: argparse.Namespace, out_dir: Path) -> dict[str, float]:
    """Count the worker (``--side worker``) or a client process (``--side client``) over the same load."""
    nc = await nats.connect(bench.server.url)
    dep = Deployment(bench, impl, 1)
    client: asyncio.subprocess.Process | None = None
    try:
        if args.cold:
            await dep.start(nc)
            counter = Counter(dep.procs[0].pid, out_dir)
            await _activate(dep, nc, 20)
            idle, idle_s = await counter.count(None, args.idle)
            # Begun once counting is on: no activation starts uncounted.
            total, took = await counter.count(None, start=lambda: _activate(dep, nc, args.cold))
        elif args.side == "worker":
            await dep.start(nc)
            counter = Counter(dep.procs[0].pid, out_dir)
            change_sets, plan = _plan(args)
            await _warm_up(dep, args, change_sets)
            idle, idle_s = await counter.count(None, args.idle)
            total, took = await counter.count(asyncio.ensure_future(_load(dep, args, change_sets, plan)))
        else:
            wrap, bench.wrap = bench.wrap, []  # the daemon runs natively; the client process is counted
            await dep.start(nc)
            client = await _start_client(bench, dep, args, wrap, out_dir)
            assert client.stdin is not None and client.stdout is not None
            counter = Counter(client.pid, out_dir)
            idle, idle_s = await counter.count(None, args.idle)
            client.stdin.write(b"go\n")
            await client.stdin.drain()
            answer = asyncio.ensure_future(client.stdout.readline())
            total, took = await counter.count(answer)
            if answer.result().strip() != b"done":
                raise RuntimeError(f"{impl}: the client process said {answer.result()!r}")
            bench.wrap = wrap
    finally:
        if client is not None:
            await _stop_client(client)
        await dep.stop(nc)
        await nc.close()
    idle_rate = idle / idle_s
    units = args.cold or args.requests
    per_request = (total - idle_rate * took) / units
    return {
        "per_request": per_request,
        "raw": total / units,
        "idle_per_s": idle_rate,
        "seconds": took,
    }


async def _start_client(
    bench: Bench, dep: Deployment, args: argparse.Namespace, wrap: list[str], out_dir: Path
) -> asyncio.subprocess.Process:
    """The load in a process of its own (under ``wrap``), warmed up: it waits for "go" on its stdin."""
    command = [*wrap, sys.executable, str(_SCRIPT), "--serve-load", dep.impl, dep.prefix]
    command += ["--url", bench.server.url, "--change-sets", str(args.change_sets)]
    command += ["--requests", str(args.requests), "--clients", str(args.clients), "--seed", str(args.seed)]
    with (out_dir / f"client-{dep.prefix}.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env=bench.env,
        )
    assert proc.stdout is not None
    async with asyncio.timeout(600):
        ready = await proc.stdout.readline()
    if ready.strip() != b"warm":
        await _stop_client(proc)
        raise RuntimeError(f"the client process did not warm up (said {ready!r}; see {log.name})")
    return proc


async def _stop_client(proc: asyncio.subprocess.Process) -> None:
    if proc.stdin is not None and not proc.stdin.is_closing():
        proc.stdin.close()  # its cue to exit
    try:
        async with asyncio.timeout(60):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def serve_load(args: argparse.Namespace) -> int:
    """``--serve-load IMPL PREFIX``: the client process of ``--side client``. Warm up, say "warm", wait for "go",
    send the plan, say "done", exit when stdin closes."""
    impl, prefix = args.serve_load
    nc = await nats.connect(args.url)
    bench = Bench(parse_args([]), server=None, procs=None)  # type: ignore[arg-type]
    dep = Deployment(bench, impl, 1)
    dep.prefix = prefix
    await dep.attach(nc)
    change_sets, plan = _plan(args)
    await _warm_up(dep, args, change_sets)
    loop = asyncio.get_running_loop()
    print("warm", flush=True)
    if (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "go":
        await _load(dep, args, change_sets, plan)
        print("done", flush=True)
        await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes it
    if dep.client is not None:
        await dep.client.close()
    await nc.close()
    return 0


async def main_async(args: argparse.Namespace, server: NatsServer, procs: Processes, out_dir: Path) -> int:
    # The warm count must see no release; the cold one counts releases a second after each change set's request.
    bench_args = parse_args(["--quiescent", "1" if args.cold else "3600"])
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
    unit = "activation" if args.cold else "request"
    results: dict[str, dict[str, float]] = {}
    for impl in [i.strip() for i in args.impl.split(",") if i.strip()]:
        print(f"[{time.strftime('%H:%M:%S')}] {impl}: the {args.side} under valgrind", flush=True)
        results[impl] = r = await measure(bench, impl, args, out_dir)
        print(
            f"    {r['per_request'] / 1e6:.3f} M instructions per {unit} ({r['raw'] / 1e6:.3f} M before taking off "
            f"{r['idle_per_s'] / 1e6:.1f} M/s of idle work over {r['seconds']:.0f} s)",
            flush=True,
        )
    base = results.get("baseline")
    if args.cold:
        print(f"\nworker: {args.cold} cold change sets, one request each, all at once")
    else:
        print(
            f"\n{args.side}: {args.requests} requests on {args.change_sets} warm change sets, {args.clients} "
            f"clients, seed {args.seed}"
        )
    for impl, r in results.items():
        ratio = ""
        if base is not None and impl != "baseline":
            ratio = f"  {r['per_request'] / base['per_request']:.2f}x the hand-written loop"
        print(f"  {impl:>9}: {r['per_request'] / 1e6:6.3f} M instructions per {unit}{ratio}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--impl",
        default="baseline,rebaser",
        help="comma-separated: baseline, rebaser (the event feed on), nofeed (off), snapshots",
    )
    parser.add_argument("--change-sets", type=int, default=20)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of the idle count")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--logs", type=Path, default=None, help="keep logs and callgrind dumps here")
    parser.add_argument(
        "--side",
        choices=("worker", "client"),
        default="worker",
        help="which process to count (default: worker)",
    )
    parser.add_argument(
        "--cold",
        type=int,
        default=0,
        metavar="N",
        help="count activations instead: N fresh change sets, one request each (worker side only)",
    )
    parser.add_argument("--serve-load", nargs=2, metavar=("IMPL", "PREFIX"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cold and args.side != "worker":
        parser.error("--cold counts the worker only")
    if args.serve_load:
        return asyncio.run(serve_load(args))
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("needs valgrind and callgrind_control on the PATH", file=sys.stderr)
        return 2
    with tempfile_dir(args.logs) as tmp, NatsServer(host="127.0.0.1") as server, Processes(tmp) as procs:
        print(f"nats-server pid {server.pid} at {server.url}; logs and dumps in {tmp}")
        return asyncio.run(main_async(args, server, procs, tmp))


if __name__ == "__main__":
    sys.exit(main())
