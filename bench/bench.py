"""End-to-end benchmark: rebaser daemons vs. a hand-written raw nats-py loop, requests with replies.

Run from the repository root (either form works)::

    python bench/bench.py                        # everything, writes the console table (a few minutes)
    python bench/bench.py --doc docs/BENCHMARKS.md   # what `make bench` runs: also the ratios page
    python bench/bench.py --quick                # smoke: 3 requests per change set, a 1,000-change-set burst
    python -m bench.bench --repeat 3 --json out.json --daemons 1 --change-sets 100

One embedded nats-server is started here (loopback only, file storage in a temporary directory, stopped at the
end) and three kinds of scenario run on it, implementations interleaved:

- **throughput** (implementation x daemons x change sets): start the daemons (``python -m rebaser_server``,
  settings via ``REBASER_*`` env) or the baseline workers (``python -m bench.baseline``) with a fresh subject
  prefix; warm up (32 requests on 8 other change sets); then ``--clients`` coroutines send 10 requests per change
  set (``--per-change-set``, or ``--requests`` in all) to change sets drawn from a seeded plan (the same for every
  implementation), one at a time each, awaiting each reply. A request is *cold* if it is the first of its change
  set in the plan (it waits for the change set's activation), else *warm*.
- **burst**: ``--burst`` fresh change sets, one request each, all sent at once; the drain time is until the last
  reply; then the time until the requests stream has no consumer left (every change set let go).
- **DVU burst**: ``--dvu-requests`` requests at once on one change set of the built-in app whose attributes
  depend on each other, with the natural DVU and with one 10x the cost of a request (``bench/apps.py``): how many
  DVU runs served the burst, and whether the final state is the one serial application gives.

Columns: req/s = replies / wall time; p50/p99 = call-to-reply latency; vs base = req/s over the baseline's in the
same scenario; act = task deliveries (activations); cpu us/req = CPU time (user + system, from /proc) of
nats-server, of all daemons/workers and of this process, per request; foreign = share of the machine's CPU used by
*other* processes meanwhile (a high value means a noisy run: use ``--repeat``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.aio.client import Client

REPO = Path(__file__).resolve().parent.parent
# Run as ``python bench/bench.py``: import ``bench`` and the project from the repository root.
if not __package__:
    sys.path[0] = str(REPO)

from bench.deployment import APPS, IMPL_ENV, LOOPS, Deployment  # noqa: E402
from bench.options import parse_args  # noqa: E402
from bench.procs import Processes, rss_kb  # noqa: E402
from bench.report import Report, write_outputs  # noqa: E402
from bench.syscalls import SyscallCounter  # noqa: E402
from bench.workload import (  # noqa: E402
    BurstResult,
    CpuMeter,
    DvuResult,
    IdleResult,
    Result,
    drive,
    first_of_each,
    ms,
)
from rebaser_client import RebaserClient  # noqa: E402
from rebaser_core.api import SetFunction, SetLiteral, SuccessStatus, Update  # noqa: E402
from rebaser_core.embedded import NatsServer  # noqa: E402
from rebaser_core.ids import ChangeSetId, WorkspacePk  # noqa: E402
from rebaser_core.subjects import LANE_CONSUMER, Subjects  # noqa: E402
from rebaser_server.record.model import ChangeSetRecord  # noqa: E402

DVU_APPS = {"natural": "rebaser_server.apps.snapshots:SnapshotApp", "10x": "bench.apps:CostlyDvuApp"}


# -- scenarios ------------------------------------------------------------------------------------------------
@dataclass
class Scenario:
    impl: str  # "baseline" or "fair" (the hand-written loops), or an APPS key
    daemons: int
    change_sets: int


class Bench:
    def __init__(self, args: argparse.Namespace, server: NatsServer, procs: Processes) -> None:
        self.args = args
        self.server = server
        self.procs = procs
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("REBASER_")}
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        self.env["REBASER_QUIESCENT_PERIOD"] = str(args.quiescent)
        # The daemons read the server's sync setting there, as an operator would have them do: under fsync always
        # they batch the removal of processed requests (rebaser_server/changeset/trimmer.py).
        if server is not None and server.monitoring_url is not None:
            self.env["REBASER_NATS_MONITORING_URLS"] = server.monitoring_url
        self.env["REBASER_CONCURRENCY"] = str(args.concurrency)
        # The daemons' default intake unless --intake names one (benchmarks measure the defaults).
        if args.intake:
            self.env["REBASER_INTAKE"] = args.intake
        for item in args.daemon_env:
            key, _, value = item.partition("=")
            self.env[key] = value
        self.gc_stats: Path | None = None
        if args.gc_stats:
            # Every daemon imports bench/gcprobe/sitecustomize.py, which writes its collector's figures here.
            self.gc_stats = procs.log_dir / "gc-stats.jsonl"
            probe = str(REPO / "bench" / "gcprobe")
            self.env["PYTHONPATH"] = os.pathsep.join((probe, self.env["PYTHONPATH"]))
            self.env["BENCH_GC_STATS"] = str(self.gc_stats)
        self.workspace = WorkspacePk.new()
        self._index = 0
        # A command the daemons and workers run under, and how long each may take to start (bench/instructions.py
        # runs them under valgrind, which starts them tens of times slower).
        self.wrap: list[str] = []
        self.ready_timeout = 60.0
        if args.cprofile is not None:
            args.cprofile.mkdir(parents=True, exist_ok=True)
            self.wrap = [sys.executable, "-m", "bench.cprof", str(args.cprofile.resolve())]

    def print_gc_stats(self, prefix: str) -> None:
        """With ``--gc-stats``: the collector's figures of each daemon (or worker) of the deployment ``prefix``."""
        if self.gc_stats is None or not self.gc_stats.exists():
            return
        for line in self.gc_stats.read_text().splitlines():
            stats = json.loads(line)
            if prefix not in stats["argv"]:
                continue
            print(
                f"    gc (pid {stats['pid']}, threshold {stats['threshold'][0]}, {stats['frozen']} frozen): "
                f"runs per generation {stats['runs']}, {sum(stats['seconds']):.2f}s in all {stats['seconds']}, "
                f"longest {max(stats['longest_ms'])} ms, peak RSS {stats['peak_rss_mb']} MB",
                flush=True,
            )

    def next_index(self) -> int:
        self._index += 1
        return self._index

    async def throughput(self, scenario: Scenario) -> Result:
        nc = await nats.connect(self.server.url, max_reconnect_attempts=-1)
        dep = Deployment(self, scenario.impl, scenario.daemons)
        try:
            change_sets = [ChangeSetId.new() for _ in range(scenario.change_sets)]
            warmup_sets = [ChangeSetId.new() for _ in range(8)]
            rng = random.Random(self.args.seed + scenario.change_sets)
            requests = self.args.requests or self.args.per_change_set * scenario.change_sets
            plan = [rng.randrange(scenario.change_sets) for _ in range(requests)]
            await dep.start(nc)

            async def send(i: int, c: int) -> bool:
                return await dep.send(change_sets[c], i)

            async def warm(i: int, c: int) -> bool:
                return await dep.send(warmup_sets[c % len(warmup_sets)], i)

            warm_up = await drive(warm, list(range(4 * len(warmup_sets))), len(warmup_sets))
            if warm_up.errors:
                raise RuntimeError(f"warm-up failed: {warm_up.errors[:3]}")
            syscalls: dict[str, int] = {}
            with contextlib.ExitStack() as stack:
                if self.args.count_syscalls:
                    syscalls = stack.enter_context(SyscallCounter(self.server.pid or 0)).counts
                meter = CpuMeter(dep.pids())
                measured = await drive(send, plan, self.args.clients)
                meter.stop(measured.seconds)
                # The removals of the last requests: what the stream still holds is what will be removed.
                await dep.drained(nc, timeout=30)
            activations = await dep.activations(nc)
        finally:
            await dep.stop(nc)
            await nc.close()
        self.print_gc_stats(dep.prefix)
        done = len(measured.latencies)
        cold = first_of_each(plan)
        lats = list(measured.latencies.values())
        cold_lats = [v for i, v in measured.latencies.items() if i in cold]
        warm_lats = [v for i, v in measured.latencies.items() if i not in cold]
        return Result(
            impl=scenario.impl,
            daemons=scenario.daemons,
            change_sets=scenario.change_sets,
            requests=len(plan),
            errors=len(measured.errors),
            seconds=round(measured.seconds, 3),
            rps=round(done / measured.seconds, 1),
            p50_ms=ms(lats, 0.50),
            p99_ms=ms(lats, 0.99),
            max_ms=round(max(lats) * 1000, 2) if lats else float("nan"),
            cold_p50_ms=ms(cold_lats, 0.50),
            cold_p99_ms=ms(cold_lats, 0.99),
            warm_p99_ms=ms(warm_lats, 0.99),
            activations=activations,
            cpu_us_per_request={k: round(v / max(done, 1) * 1e6) for k, v in meter.used.items()},
            foreign_load=meter.foreign,
            first_errors=sorted(set(measured.errors))[:5],
            syscalls_per_request={k: round(v / max(done, 1), 2) for k, v in syscalls.items()},
        )

    async def burst(self, impl: str) -> BurstResult:
        """``--burst`` change sets, one request each, all at once; then until every consumer is gone."""
        count = self.args.burst
        nc = await nats.connect(self.server.url, max_reconnect_attempts=-1)
        dep = Deployment(self, impl, 1)
        try:
            # The cap on owned change sets must not bind here either (the hand-written loop takes up to 20,000):
            # with 2,000 slots and a 5 s quiet period the burst could not drain faster than 400 change sets/s.
            await dep.start(nc, env={"REBASER_CONCURRENCY": str(max(self.args.concurrency, count))})
            change_sets = [ChangeSetId.new() for _ in range(count)]

            async def send(i: int, c: int) -> bool:
                return await dep.send(change_sets[c], i)

            meter = CpuMeter(dep.pids())
            measured = await drive(send, list(range(count)), count)
            meter.stop(measured.seconds)
            drained = time.perf_counter()
            zero: float | None = None
            deadline = drained + 2 * self.args.quiescent + 60
            while time.perf_counter() < deadline:
                if await dep.consumers(nc) == 0:
                    zero = round(time.perf_counter() - drained, 1)
                    break
                await asyncio.sleep(0.25)
        finally:
            await dep.stop(nc)
            await nc.close()
        self.print_gc_stats(dep.prefix)
        lats = list(measured.latencies.values())
        return BurstResult(
            impl=impl,
            change_sets=count,
            errors=len(measured.errors),
            drain_s=round(measured.seconds, 2),
            p50_ms=ms(lats, 0.50),
            p99_ms=ms(lats, 0.99),
            consumers_zero_s=zero,
            foreign_load=meter.foreign,
            cpu_us_per_change_set={k: round(v / max(count, 1) * 1e6) for k, v in meter.used.items()},
            first_errors=sorted(set(measured.errors))[:5],
        )

    async def idle(self, impl: str) -> IdleResult:
        """``--idle`` change sets taken (one request each) and then left idle, held for the whole window: the CPU of
        a window with them held, less that of the same window before any was taken, per change set and second (and
        the memory, likewise). Then the next request to each, still held; and on a second deployment, the next
        request to each once it was let go (its quiescent period ran out)."""
        count, window = self.args.idle, self.args.idle_window
        nc = await nats.connect(self.server.url, max_reconnect_attempts=-1)
        # Idle for longer than the run: none is let go while measured.
        held_env = {"REBASER_QUIESCENT_PERIOD": str(10 * window + 60)}
        dep = Deployment(self, impl, 1)
        errors = 0
        try:
            await dep.start(nc, env={**self._idle_env(count), **held_env})
            change_sets = [ChangeSetId.new() for _ in range(count)]

            async def send(i: int, c: int) -> bool:
                return await dep.send(change_sets[c], i)

            empty = CpuMeter(dep.pids())
            empty_rss = {k: sum(map(rss_kb, v)) for k, v in dep.pids().items()}
            await asyncio.sleep(window)
            empty.stop(window)
            errors += len((await drive(send, list(range(count)), self.args.clients)).errors)
            held = CpuMeter(dep.pids())
            await asyncio.sleep(window)
            held.stop(window)
            held_rss = {k: sum(map(rss_kb, v)) for k, v in dep.pids().items()}
            _, stream, consumer = dep.streams
            owned = sum(
                info.num_ack_pending or 0
                for info in await nc.jetstream().consumers_info(stream)
                # the shared one, (fair) each workspace's, or (lanes) each lane's
                if (info.name or "").startswith((consumer, LANE_CONSUMER))
            )
            next_held = await drive(send, list(range(count)), 8)
            errors += len(next_held.errors)
        finally:
            await dep.stop(nc)
        try:
            next_released, released_errors = await self._next_after_release(nc, impl, count)
            errors += released_errors
        finally:
            await nc.close()
        return IdleResult(
            impl=impl,
            change_sets=count,
            window_s=window,
            owned=owned,
            ack_wait=self._failover_bound(impl),
            cpu_us_per_s_per_change_set={
                k: round((held.used[k] - empty.used[k]) / window / count * 1e6, 2) for k in held.used
            },
            rss_kb_per_change_set={k: round((held_rss[k] - empty_rss[k]) / count, 2) for k in held_rss},
            next_held_ms=(
                ms(list(next_held.latencies.values()), 0.5),
                ms(list(next_held.latencies.values()), 0.99),
            ),
            next_released_ms=next_released,
            errors=errors,
        )

    def _failover_bound(self, impl: str) -> float:
        """How long a dead owner's change sets wait at most: the tasks consumer's ack_wait, or with lease_mode daemon
        the heartbeat's ack_wait plus one look of the peers (every progress_period)."""
        if impl in LOOPS:
            return 2.5
        env = {**self.env, **IMPL_ENV.get(impl, {})}
        ack_wait = float(env.get("REBASER_ACK_WAIT", "2.5"))
        if env.get("REBASER_LEASE_MODE") == "daemon":
            return ack_wait + float(env.get("REBASER_PROGRESS_PERIOD", "0.5"))
        return ack_wait

    def _idle_env(self, count: int) -> dict[str, str]:
        return {"REBASER_CONCURRENCY": str(max(self.args.concurrency, count))}

    async def _next_after_release(self, nc: Client, impl: str, count: int) -> tuple[tuple[float, float], int]:
        """One request to each of ``count`` change sets, then, once every one was let go, the next: its p50 and
        p99 (ms), and the errors."""
        dep = Deployment(self, impl, 1)
        try:
            await dep.start(nc, env={**self._idle_env(count), "REBASER_QUIESCENT_PERIOD": "1"})
            change_sets = [ChangeSetId.new() for _ in range(count)]

            async def send(i: int, c: int) -> bool:
                return await dep.send(change_sets[c], i)

            first = await drive(send, list(range(count)), self.args.clients)
            deadline = time.monotonic() + 60
            while await dep.consumers(nc) != 0 and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.25)  # polling the server: every change set let go
            second = await drive(send, list(range(count)), 8)
        finally:
            await dep.stop(nc)
        lats = list(second.latencies.values())
        return (ms(lats, 0.5), ms(lats, 0.99)), len(first.errors) + len(second.errors)

    async def dvu_burst(self, cost: str) -> DvuResult:
        """``--dvu-requests`` requests at once on one change set whose attributes depend on ``/x``."""
        count = self.args.dvu_requests
        nc = await nats.connect(self.server.url, max_reconnect_attempts=-1)
        dep = Deployment(self, "snapshots", 1, app=DVU_APPS[cost])
        wk, cs = self.workspace, ChangeSetId.new()
        try:
            await dep.start(nc)
            client = dep.client
            assert client is not None
            functions: list[Update] = [
                SetLiteral(path="/x", value=-1),
                SetFunction(path="/y", function="identity", args=["/x"]),
                SetFunction(path="/z", function="sum", args=["/x", "/y"]),
            ]
            await client.enqueue_updates_with_reply(wk, cs, functions, timeout=self.args.timeout)
            before = await self._settled_dvu_runs(nc, dep.prefix, client, wk, cs)

            async def send(i: int, _c: int) -> bool:
                updates = [SetLiteral(path="/x", value=i)]
                answer = await client.enqueue_updates_with_reply(wk, cs, updates, timeout=self.args.timeout)
                return isinstance(answer.status, SuccessStatus)

            measured = await drive(send, list(range(count)), count)  # a burst: all at once
            after = await self._settled_dvu_runs(nc, dep.prefix, client, wk, cs)
            state = await client.get_change_set(wk, cs)
        finally:
            await dep.stop(nc)
            await nc.close()
        x, y, z = (state.values.get(p) for p in ("/x", "/y", "/z"))
        # Serial application ends with /x = the last request applied, /y = /x and /z = 2x, no error values.
        ok = isinstance(x, int) and 0 <= x < count and y == x and z == 2 * x and not state.errors
        return DvuResult(
            cost=cost,
            requests=count,
            errors=len(measured.errors),
            seconds=round(measured.seconds, 2),
            dvu_runs=after - before,
            state_ok=ok and not measured.errors,
            detail=f"x={x} y={y} z={z} errors={dict(state.errors)}",
        )

    async def _settled_dvu_runs(
        self, nc: Client, prefix: str, client: RebaserClient, wk: WorkspacePk, cs: ChangeSetId
    ) -> int:
        """Wait (bounded) until no DVU is due, then read the change set's DVU run count from its record."""
        deadline = time.monotonic() + self.args.timeout
        while (await client.get_change_set(wk, cs)).dvu_pending and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)  # polling the daemon: nothing here to await
        subjects = Subjects(prefix)
        kv = await nc.jetstream().key_value(subjects.change_sets_bucket)
        entry = await kv.get(Subjects.change_set_key(wk, cs))
        assert entry.value is not None
        return int(ChangeSetRecord.decode(entry.value).state.get("dvu_runs", 0))


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


async def main_async(args: argparse.Namespace, server: NatsServer, procs: Processes) -> Report:
    """Run every scenario (implementations interleaved, ``--repeat`` times); return what to report."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    bench = Bench(args, server, procs)
    impls = [impl.strip() for impl in args.impl.split(",") if impl.strip()]
    unknown = set(impls) - {*LOOPS, *APPS}
    if unknown:
        raise SystemExit(f"unknown --impl {', '.join(sorted(unknown))}")
    report = Report(args)
    for daemons in (int(x) for x in args.daemons.split(",")):
        for change_sets in (int(x) for x in args.change_sets.split(",")):
            runs: dict[str, list[Result]] = {impl: [] for impl in impls}
            for attempt in range(args.repeat):
                for impl in impls:
                    run = f" (run {attempt + 1}/{args.repeat})" if args.repeat > 1 else ""
                    log(f"{impl}: {daemons} daemon(s), {change_sets} change sets{run}")
                    result = await bench.throughput(Scenario(impl, daemons, change_sets))
                    runs[impl].append(result)
                    report.every.append(result)
                    print(
                        f"    {result.rps:.0f} req/s, p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, "
                        f"cold p50 {result.cold_p50_ms:.1f} ms, cold p99 {result.cold_p99_ms:.1f} ms, "
                        f"{result.errors} errors, foreign load {result.foreign_load:.0%}"
                        + (f" (e.g. {result.first_errors[0]})" if result.first_errors else ""),
                        flush=True,
                    )
            # Report the run with the median throughput of each implementation; "vs base" is against the fair loop
            # (the plain one if it did not run).
            medians = {impl: sorted(rs, key=lambda r: r.rps)[len(rs) // 2] for impl, rs in runs.items()}
            base = medians.get("fair", medians.get("baseline"))
            for impl, result in medians.items():
                if impl not in LOOPS and base is not None and base.rps > 0:
                    result.ratio = round(result.rps / base.rps, 3)
                report.results.append(result)
    if args.burst > 0:
        for impl in [i for i in ("baseline", "fair", "rebaser") if i in impls]:
            log(f"burst: {impl}, {args.burst} change sets x 1 request")
            burst = await bench.burst(impl)
            report.bursts.append(burst)
            print(
                f"    drained in {burst.drain_s:.1f}s, p99 {burst.p99_ms / 1000:.1f}s, {burst.errors} errors, "
                f"consumers gone after {burst.consumers_zero_s}s"
                + (f" (e.g. {burst.first_errors[0]})" if burst.first_errors else ""),
                flush=True,
            )
    if args.idle > 0:
        for impl in [i for i in ("fair", "rebaser", "leases") if i in impls]:
            log(f"idle: {impl}, {args.idle} change sets owned and idle")
            idle = await bench.idle(impl)
            report.idles.append(idle)
            print(f"    {idle.line()}", flush=True)
    if args.dvu_requests > 0 and "snapshots" in impls:
        for cost in DVU_APPS:
            log(f"DVU burst: {args.dvu_requests} requests on one change set, {cost} DVU cost")
            dvu = await bench.dvu_burst(cost)
            report.dvus.append(dvu)
            print(
                f"    {dvu.dvu_runs} DVU runs, state {'as serial' if dvu.state_ok else 'WRONG'} ({dvu.detail})",
                flush=True,
            )
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    print(
        f"rebaser benchmark: {args.requests or f'{args.per_change_set} x change sets'} requests/scenario, "
        f"{args.clients} clients, "
        f"quiescent period {args.quiescent}s, daemon concurrency {args.concurrency}, file storage, "
        f"server sync {args.sync or 'interval (2m)'}"
        + (f", daemon env {' '.join(args.daemon_env)}" if args.daemon_env else "")
    )
    with (
        tempfile_dir(args.logs) as tmp,
        NatsServer(host="127.0.0.1", sync=args.sync) as server,
        Processes(tmp) as procs,
    ):
        print(f"nats-server pid {server.pid} at {server.url}; logs in {tmp}")
        try:
            report = asyncio.run(main_async(args, server, procs))
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("interrupted: stopping every subprocess", file=sys.stderr)
            return 130
    report.wall_seconds = time.monotonic() - began
    write_outputs(report)
    return 0


@contextlib.contextmanager
def tempfile_dir(keep: Path | None = None) -> Iterator[Path]:
    """Where the subprocesses' logs go: ``keep`` (created, left in place), or a temporary directory."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="rebaser-bench-") as tmp:
        yield Path(tmp)


if __name__ == "__main__":
    sys.exit(main())
