"""End-to-end benchmark: rebaser daemons vs. a minimal raw nats-py baseline, requests with replies.

Run from the repository root (either form works)::

    python bench/bench.py                    # full: 3000 requests per scenario, 8 scenarios (about a minute)
    python bench/bench.py --quick            # smoke: 300 requests per scenario (about 25 s)
    python -m bench.bench --repeat 3 --json out.json --daemons 1 --change-sets 100

Per scenario (implementation x daemons x change sets), on one embedded nats-server started here (loopback only,
file storage in a temporary directory, stopped at the end):

- start the daemons (``python -m rebaser_server``, settings via ``REBASER_*`` env) or the baseline workers
  (``python -m bench.baseline``) as subprocesses with a fresh subject prefix, and wait until each is serving;
- warm up (32 requests on 8 change sets outside the measured set, not counted);
- ``--clients`` coroutines in this process send ``--requests`` requests with replies between them, each to a change
  set drawn from a seeded plan (the same for both implementations), one request at a time per coroutine, and
  record call-to-reply latency;
- stop the subprocesses by PID (SIGTERM, SIGKILL after 30 s) and delete the scenario's streams.

Columns: req/s = replies / wall time of the measured phase; p50/p99 = call-to-reply latency; vs base = rebaser req/s
over baseline req/s in the same scenario; act = task deliveries (change-set activations) by the tasks consumer;
cpu us/req = CPU time (user + system, from /proc) during the measured phase per request, of nats-server, of all
daemons/workers, and of the client (this process); foreign = share of the machine's CPU used by *other* processes
meanwhile (on a shared 2-core machine a high value means the run is noisy: use ``--repeat``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import nats
from nats.aio.client import Client

REPO = Path(__file__).resolve().parent.parent
# Run as ``python bench/bench.py``: import ``bench`` and the project from the repository root.
if not __package__:
    sys.path[0] = str(REPO)

from bench.baseline import BaselineClient, setup_streams  # noqa: E402
from rebaser_client import RebaserClient  # noqa: E402
from rebaser_core.api import SetLiteral, SuccessStatus  # noqa: E402
from rebaser_core.embedded import NatsServer  # noqa: E402
from rebaser_core.ids import ChangeSetId, WorkspacePk  # noqa: E402

# "rebaser" measures the framework (the spine) with the smallest app, the yardstick for the baseline ratio;
# "snapshots" runs the default application (object-store snapshots, DVU) to show the cost of real work.
APPS = {
    "rebaser": "rebaser_server.apps.counter:CounterApp",
    "snapshots": "rebaser_server.apps.snapshots:SnapshotApp",
}
CLK_TCK = os.sysconf("SC_CLK_TCK")
Send = Callable[[int, int], Awaitable[bool]]


# -- processes ------------------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """In the child: get SIGTERM if the benchmark dies (Linux), so nothing outlives a killed run."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds all processes on this machine spent busy so far (from /proc/stat; 0 if unavailable)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


class Processes:
    """Every subprocess the benchmark starts; all are stopped by PID on exit, also on Ctrl-C or error."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[int, tuple[subprocess.Popen[bytes], Path]] = {}

    def spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                args,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches only us; we stop the children in order
                preexec_fn=_die_with_parent,
            )
        self.procs[proc.pid] = (proc, log)
        return proc

    def log_of(self, proc: subprocess.Popen[bytes]) -> str:
        return self.procs[proc.pid][1].read_text(errors="replace")

    async def wait_ready(self, proc: subprocess.Popen[bytes], marker: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.log_of(proc):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(self.log_of(proc).splitlines()[-20:])
                raise RuntimeError(f"process {proc.pid} {proc.args!r} did not become ready:\n{tail}")
            await asyncio.sleep(0.05)

    async def stop(self, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            for _ in range(int(timeout / 0.05)):
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                print(f"  pid {proc.pid} ignored SIGTERM for {timeout}s: killing it", file=sys.stderr)
                proc.kill()
        proc.wait()
        self.procs.pop(proc.pid, None)

    def stop_all(self) -> None:
        for proc, _ in list(self.procs.values()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for pid, (proc, _) in list(self.procs.items()):
            try:
                proc.wait(timeout=15.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self.procs.pop(pid, None)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()


# -- workload -------------------------------------------------------------------------------------------------
@dataclass
class Result:
    impl: str
    daemons: int
    change_sets: int
    requests: int
    errors: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    activations: int
    cpu_us_per_request: dict[str, float] = field(default_factory=dict)
    foreign_load: float = 0.0  # share of the machine's CPUs used by processes outside the benchmark
    ratio: float | None = None
    first_errors: list[str] = field(default_factory=list)


@dataclass
class Drive:
    latencies: list[float]
    errors: list[str]
    seconds: float


async def drive(send: Send, plan: list[int], clients: int) -> Drive:
    """``clients`` coroutines share the plan; each sends one request at a time and waits for its reply."""
    latencies: list[float] = []
    errors: list[str] = []
    todo: Iterator[int] = iter(range(len(plan)))

    async def client() -> None:
        for i in todo:
            start = time.perf_counter()
            try:
                ok = await send(i, plan[i])
                error = "" if ok else "unsuccessful reply"
            except Exception as err:
                error = f"{type(err).__name__}: {err}"
            if error:
                errors.append(error)
            else:
                latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return Drive(latencies, errors, time.perf_counter() - start)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


# -- scenarios ------------------------------------------------------------------------------------------------
@dataclass
class Scenario:
    impl: str  # "baseline" or "rebaser"
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
        self.env["REBASER_CONCURRENCY"] = str(args.concurrency)
        for item in args.daemon_env:
            key, _, value = item.partition("=")
            self.env[key] = value
        self.workspace = WorkspacePk.new()

    async def run(self, scenario: Scenario, index: int) -> Result:
        prefix = f"b{index}{scenario.impl[0]}{secrets.token_hex(3)}"
        nc = await nats.connect(self.server.url, max_reconnect_attempts=-1)
        started: list[subprocess.Popen[bytes]] = []
        try:
            change_sets = [ChangeSetId.new() for _ in range(scenario.change_sets)]
            warmup_sets = [ChangeSetId.new() for _ in range(8)]
            rng = random.Random(self.args.seed + scenario.change_sets)
            plan = [rng.randrange(scenario.change_sets) for _ in range(self.args.requests)]
            if scenario.impl != "baseline":
                started = self._spawn_daemons(prefix, scenario.daemons, APPS[scenario.impl])
                for proc in started:
                    await self.procs.wait_ready(proc, "rebaser daemon serving")
                client = RebaserClient(nc, prefix=prefix)
                wk, timeout = self.workspace, self.args.timeout

                async def send_to(cs: ChangeSetId, i: int) -> bool:
                    updates = [SetLiteral(path="/n", value=i)]
                    reply = await client.enqueue_updates_with_reply(wk, cs, updates, timeout=timeout)
                    return isinstance(reply.status, SuccessStatus)

            else:
                await setup_streams(nc.jetstream(), prefix)
                started = self._spawn_workers(prefix, scenario.daemons)
                for proc in started:
                    await self.procs.wait_ready(proc, "baseline worker ready")
                base = BaselineClient(nc, prefix)
                await base.start()

                async def send_to(cs: ChangeSetId, i: int) -> bool:
                    reply = await base.call(str(cs), i, self.args.timeout)
                    return bool(reply["ok"]) and reply["value"] == i

            async def send(i: int, c: int) -> bool:
                return await send_to(change_sets[c], i)

            async def warm(i: int, c: int) -> bool:
                return await send_to(warmup_sets[c % len(warmup_sets)], i)

            warm_up = await drive(warm, list(range(4 * len(warmup_sets))), len(warmup_sets))
            if warm_up.errors:
                raise RuntimeError(f"warm-up failed: {warm_up.errors[:3]}")
            pids = {"nats-server": [self.server.pid or 0], "daemons": [p.pid for p in started]}
            pids["client"] = [os.getpid()]
            before = {k: sum(map(cpu_seconds, v)) for k, v in pids.items()}
            busy_before = machine_busy_seconds()
            measured = await drive(send, plan, self.args.clients)
            after = {k: sum(map(cpu_seconds, v)) for k, v in pids.items()}
            busy = machine_busy_seconds() - busy_before
            activations = await self._activations(nc, prefix, scenario.impl)
        finally:
            for proc in started:
                await self.procs.stop(proc)
            await self._delete_streams(nc, prefix)
            await nc.close()
        done = len(measured.latencies)
        ours = sum(after.values()) - sum(before.values())
        lat_ms = sorted(x * 1000 for x in measured.latencies)
        return Result(
            impl=scenario.impl,
            daemons=scenario.daemons,
            change_sets=scenario.change_sets,
            requests=len(plan),
            errors=len(measured.errors),
            seconds=round(measured.seconds, 3),
            rps=round(done / measured.seconds, 1),
            p50_ms=round(percentile(lat_ms, 0.50), 2),
            p99_ms=round(percentile(lat_ms, 0.99), 2),
            max_ms=round(lat_ms[-1], 2) if lat_ms else float("nan"),
            activations=activations,
            cpu_us_per_request={k: round((after[k] - before[k]) / max(done, 1) * 1e6) for k in before},
            foreign_load=round(max(0.0, busy - ours) / (measured.seconds * (os.cpu_count() or 1)), 3),
            first_errors=sorted(set(measured.errors))[:5],
        )

    def _spawn_daemons(self, prefix: str, count: int, app: str) -> list[subprocess.Popen[bytes]]:
        args = [sys.executable, "-m", "rebaser_server", "--nats-url", self.server.url, "--prefix", prefix]
        # No health endpoint: several daemons share this host, and a taken health port is an error.
        args += ["--app", app, "--log-level", "WARNING", "--http-port", "-1"]
        return [self.procs.spawn(f"{prefix}-daemon{i}", args, self.env) for i in range(count)]

    def _spawn_workers(self, prefix: str, count: int) -> list[subprocess.Popen[bytes]]:
        args = [sys.executable, "-m", "bench.baseline", "--url", self.server.url, "--prefix", prefix]
        args += ["--quiet", str(self.args.quiescent)]
        return [self.procs.spawn(f"{prefix}-worker{i}", args, self.env) for i in range(count)]

    @staticmethod
    async def _activations(nc: Client, prefix: str, impl: str) -> int:
        stream, consumer = (
            (f"{prefix}_REBASER_TASKS", "rebaser-tasks")
            if impl != "baseline"
            else (f"{prefix}_TASKS", "tasks")
        )
        try:
            info = await nc.jetstream().consumer_info(stream, consumer)
        except Exception:
            return -1
        return int(info.delivered.consumer_seq or 0) if info.delivered else -1

    @staticmethod
    async def _delete_streams(nc: Client, prefix: str) -> None:
        js = nc.jetstream()
        with contextlib.suppress(Exception):
            for info in await js.streams_info():
                name = info.config.name or ""
                if name.startswith((f"{prefix}_", f"KV_{prefix}_")):
                    await js.delete_stream(name)


# -- output ---------------------------------------------------------------------------------------------------
COLUMNS = [
    ("impl", 8),
    ("daemons", 7),
    ("change sets", 11),
    ("requests", 8),
    ("errors", 6),
    ("req/s", 8),
    ("p50 ms", 8),
    ("p99 ms", 8),
    ("vs base", 7),
    ("act", 5),
    ("cpu us/req: srv", 15),
    ("daemons", 7),
    ("client", 6),
    ("foreign", 7),
]


def table(results: list[Result]) -> str:
    lines = ["  ".join(name.rjust(width) for name, width in COLUMNS)]
    for r in results:
        cpu = r.cpu_us_per_request
        row = [
            r.impl,
            r.daemons,
            r.change_sets,
            r.requests,
            r.errors,
            f"{r.rps:.0f}",
            f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}",
            "" if r.ratio is None else f"{r.ratio:.2f}",
            r.activations,
            cpu.get("nats-server", ""),
            cpu.get("daemons", ""),
            cpu.get("client", ""),
            f"{r.foreign_load:.0%}",
        ]
        lines.append("  ".join(str(v).rjust(w) for v, (_, w) in zip(row, COLUMNS, strict=True)))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="rebaser end-to-end benchmark (see the module docstring)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 300 requests per scenario")
    parser.add_argument("--requests", type=int, default=None, help="requests per scenario (default 3000)")
    parser.add_argument("--clients", type=int, default=64, help="concurrent client coroutines")
    parser.add_argument("--daemons", default="1,2", help="comma-separated daemon/worker counts")
    parser.add_argument("--change-sets", default="100,1000", help="comma-separated change-set counts")
    parser.add_argument(
        "--impl",
        default="baseline,rebaser,snapshots",
        help="comma-separated: baseline (hand-written nats-py), rebaser (framework + CounterApp), "
        "snapshots (framework + the default SnapshotApp)",
    )
    parser.add_argument("--quiescent", type=float, default=5.0, help="quiescent period, seconds")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=2000,
        help="REBASER_CONCURRENCY per daemon (above the change-set count so the cap never binds; "
        "the production default is 500)",
    )
    parser.add_argument(
        "--daemon-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for daemons/workers, e.g. REBASER_IDEMPOTENCY_WINDOW=16 (repeatable)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request reply timeout")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per scenario; the median-throughput run is reported"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    if args.requests is None:
        args.requests = 300 if args.quick else 3000
    return args


async def main_async(
    args: argparse.Namespace, server: NatsServer, procs: Processes
) -> tuple[list[Result], list[Result]]:
    """Run every scenario ``--repeat`` times (implementations interleaved); return (reported, all runs)."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    bench = Bench(args, server, procs)
    impls = [impl.strip() for impl in args.impl.split(",") if impl.strip()]
    unknown = set(impls) - {"baseline", *APPS}
    if unknown:
        raise SystemExit(f"unknown --impl {', '.join(sorted(unknown))}")
    reported: list[Result] = []
    every: list[Result] = []
    index = 0
    for daemons in (int(x) for x in args.daemons.split(",")):
        for change_sets in (int(x) for x in args.change_sets.split(",")):
            runs: dict[str, list[Result]] = {impl: [] for impl in impls}
            for attempt in range(args.repeat):
                for impl in impls:
                    index += 1
                    run = f" (run {attempt + 1}/{args.repeat})" if args.repeat > 1 else ""
                    print(
                        f"[{time.strftime('%H:%M:%S')}] {impl}: {daemons} daemon(s), {change_sets} change sets{run}"
                    )
                    result = await bench.run(Scenario(impl, daemons, change_sets), index)
                    runs[impl].append(result)
                    every.append(result)
                    print(
                        f"    {result.rps:.0f} req/s, p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, "
                        f"{result.errors} errors, foreign load {result.foreign_load:.0%}"
                        + (f" (e.g. {result.first_errors[0]})" if result.first_errors else ""),
                        flush=True,
                    )
            # Report the run with the median throughput of each implementation.
            medians = {impl: sorted(rs, key=lambda r: r.rps)[len(rs) // 2] for impl, rs in runs.items()}
            base = medians.get("baseline")
            for impl, result in medians.items():
                if impl != "baseline" and base is not None and base.rps > 0:
                    result.ratio = round(result.rps / base.rps, 3)
                reported.append(result)
    return reported, every


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    print(
        f"rebaser benchmark: {args.requests} requests/scenario, {args.clients} clients, "
        f"quiescent period {args.quiescent}s, daemon concurrency {args.concurrency}, file storage"
        + (f", daemon env {' '.join(args.daemon_env)}" if args.daemon_env else "")
    )
    with (
        tempfile.TemporaryDirectory(prefix="rebaser-bench-") as tmp,
        NatsServer(host="127.0.0.1") as server,
        Processes(Path(tmp)) as procs,
    ):
        print(f"nats-server pid {server.pid} at {server.url}; logs in {tmp}")
        try:
            results, every = asyncio.run(main_async(args, server, procs))
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("interrupted: stopping every subprocess", file=sys.stderr)
            return 130
    elapsed = time.monotonic() - began
    print()
    print(table(results))
    print(f"\ntotal wall time {elapsed:.0f}s")
    if args.json is not None:
        payload: dict[str, Any] = {
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "wall_seconds": round(elapsed, 1),
            "results": [asdict(r) for r in results],
            "all_runs": [asdict(r) for r in every],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
