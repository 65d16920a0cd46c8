"""What callers in accounts of their own cost (docs/accounts.md): the same load through service imports or not.

    .venv/bin/python -m bench.accounts [--rounds 2] [--workspaces 200] [--change-sets 2] [--callers 64]
                                       [--requests 4000] [--daemons 1] [--json PATH]

Each run starts a fresh nats-server with ``-c docs/nats-accounts.conf`` (127.0.0.1, a free port, file store in a
temporary directory) and ``--daemons`` daemons in the daemons' account (``rebaser-daemon``, no subject prefix,
the default daemon settings but for a closed health port and WARNING logs), then ``--callers`` coroutines in this
process send ``--requests`` requests with ``enqueue_updates_with_reply`` to ``--workspaces`` x ``--change-sets``
change sets (a seeded plan, the same in every run), one at a time each, awaiting each reply. Two kinds of run,
interleaved (A, B, A, B for ``--rounds 2``):

- ``one account`` (A): the callers connect as ``rebaser-operator``, a user of the daemons' own account, as every
  caller did before the accounts;
- ``accounts`` (B): the callers connect as ``client-1`` (inbox prefix ``_INBOX.client-1``), in an account of its
  own: every request, layout read and backlog query crosses a service import, every reply a stream import.

Before measuring, ``--warmup`` requests on 8 change sets of another workspace. Reported per run: throughput
(replies / wall time), p50 and p99 latency, errors, the CPU seconds nats-server, the daemons and this process
spent during the measured part (from /proc), and the share of the machine other processes used meanwhile
(foreign: a high value means a noisy run); then the means of A and B and their ratio B/A.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nats
from nats.aio.client import Client as NatsClient

from bench.procs import REPO, Processes
from bench.workload import CpuMeter, drive, ms
from rebaser_client import RebaserClient
from rebaser_core.api import SetLiteral
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, WorkspacePk

CONF = REPO / "docs" / "nats-accounts.conf"
DAEMON_USER, DAEMON_PASSWORD = "rebaser-daemon", "change-me-daemon"
# kind -> (label, user, password, inbox prefix): who the callers are in each kind of run.
KINDS: dict[str, tuple[str, str, str, str | None]] = {
    "A": ("one account", "rebaser-operator", "change-me-operator", None),
    "B": ("accounts", "client-1", "change-me-client-1", "_INBOX.client-1"),
}
# The client-1 account's max_connections in the reference configuration.
MAX_CONNECTIONS = 64


@dataclass
class RunResult:
    kind: str  # "A" or "B"
    label: str
    round: int
    requests: int
    errors: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    server_cpu_s: float
    daemons_cpu_s: float
    callers_cpu_s: float
    foreign_load: float
    async_errors: int = 0  # errors the server sent the callers' connections (a permission, a limit)
    first_errors: list[str] = field(default_factory=list)


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def daemon_env() -> dict[str, str]:
    """This process's environment without any REBASER_* setting (the daemons run on the defaults)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REBASER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return env


async def connect_callers(
    server: NatsServer, kind: str, count: int, async_errors: list[str]
) -> list[NatsClient]:
    _, user, password, inbox_prefix = KINDS[kind]

    async def on_error(err: Exception) -> None:
        async_errors.append(f"{type(err).__name__}: {err}")

    conns: list[NatsClient] = []
    try:
        for _ in range(count):
            conns.append(
                await nats.connect(
                    server.url,
                    user=user,
                    password=password,
                    inbox_prefix=inbox_prefix or "_INBOX",
                    error_cb=on_error,
                    max_reconnect_attempts=0,
                    connect_timeout=5,
                )
            )
    except BaseException:
        for conn in conns:
            await conn.close()
        raise
    return conns


async def one_run(
    args: argparse.Namespace,
    kind: str,
    round_: int,
    plan: list[tuple[int, int]],
    log_dir: Path,
) -> RunResult:
    """One fresh nats-server and daemons; warm up; drive the plan as ``kind``'s callers."""
    label = KINDS[kind][0]
    with tempfile.TemporaryDirectory(prefix="rebaser-accounts-") as store, Processes(log_dir) as procs:
        # Started from this (the main) thread, with the parent-death signal: it cannot outlive a killed run.
        server = NatsServer(
            store_dir=Path(store) / "nats",
            host="127.0.0.1",
            include=CONF,
            die_with_parent=True,
        )
        server.start()  # a short block (until it listens): nothing else runs yet
        conns: list[NatsClient] = []
        clients: list[RebaserClient] = []
        try:
            command = [sys.executable, "-m", "rebaser_server", "--nats-url", server.url]
            command += ["--user", DAEMON_USER, "--password", DAEMON_PASSWORD]
            # No health endpoint (several daemons on one host; a taken port is an error) and few log lines.
            command += ["--http-port", "-1", "--log-level", "WARNING"]
            if args.app:
                command += ["--app", args.app]
            env = daemon_env()
            daemons = [procs.spawn(f"r{round_}{kind}-daemon-{i}", command, env) for i in range(args.daemons)]
            for proc in daemons:
                await procs.wait_ready(proc, "rebaser daemon serving", timeout=args.ready_timeout)
            async_errors: list[str] = []
            conns = await connect_callers(server, kind, args.connections, async_errors)
            clients = [RebaserClient(conn, max_in_flight=4096) for conn in conns]
            for client in clients:
                await client.start()  # reads the shard layout (a direct get, through an import in B)
            workspaces = [WorkspacePk.new() for _ in range(args.workspaces)]
            change_sets = [[ChangeSetId.new() for _ in range(args.change_sets)] for _ in workspaces]
            warm_wk, warm_sets = WorkspacePk.new(), [ChangeSetId.new() for _ in range(8)]

            async def send(i: int, target: int) -> bool:
                wk, c = plan[target]
                client = clients[i % len(clients)]
                updates = [SetLiteral(path="/n", value=i)]
                reply = await client.enqueue_updates_with_reply(
                    workspaces[wk], change_sets[wk][c], updates, timeout=args.timeout
                )
                return reply.ok

            async def warm(i: int, c: int) -> bool:
                client = clients[i % len(clients)]
                updates = [SetLiteral(path="/n", value=i)]
                reply = await client.enqueue_updates_with_reply(
                    warm_wk, warm_sets[c], updates, timeout=args.timeout
                )
                return reply.ok

            warm_up = await asyncio.wait_for(
                drive(warm, [i % len(warm_sets) for i in range(args.warmup)], len(warm_sets)),
                args.run_timeout,
            )
            if warm_up.errors:
                raise RuntimeError(f"warm-up failed: {warm_up.errors[:3]}")
            async_errors.clear()
            pids = {
                "nats-server": [server.pid or 0],
                "daemons": [p.pid for p in daemons],
                "callers": [os.getpid()],
            }
            meter = CpuMeter(pids)
            measured = await asyncio.wait_for(
                drive(send, list(range(len(plan))), args.callers), args.run_timeout
            )
            meter.stop(measured.seconds)
            for proc in daemons:
                if proc.poll() is not None:
                    raise RuntimeError(f"daemon {proc.pid} exited ({proc.returncode}) during the run")
        finally:
            for client in clients:
                await client.close()
            for conn in conns:
                await conn.close()
            for started, _ in list(procs.procs.values()):  # the daemons, by PID, before their server
                await procs.stop(started)
            await asyncio.to_thread(server.stop)
    lats = list(measured.latencies.values())
    done = len(lats)
    return RunResult(
        kind=kind,
        label=label,
        round=round_,
        requests=len(plan),
        errors=len(measured.errors),
        seconds=round(measured.seconds, 3),
        rps=round(done / measured.seconds, 1),
        p50_ms=ms(lats, 0.50),
        p99_ms=ms(lats, 0.99),
        max_ms=round(max(lats) * 1000, 2) if lats else float("nan"),
        server_cpu_s=round(meter.used["nats-server"], 2),
        daemons_cpu_s=round(meter.used["daemons"], 2),
        callers_cpu_s=round(meter.used["callers"], 2),
        foreign_load=meter.foreign,
        async_errors=len(async_errors),
        first_errors=sorted(set(measured.errors + async_errors))[:5],
    )


METRICS = ("rps", "p50_ms", "p99_ms", "errors", "server_cpu_s", "daemons_cpu_s", "callers_cpu_s")


def summary(results: list[RunResult]) -> dict[str, dict[str, float]]:
    """The mean of each metric over A's runs and over B's, and B/A."""
    means: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        runs = [r for r in results if r.kind == kind]
        if runs:
            means[kind] = {m: sum(float(getattr(r, m)) for r in runs) / len(runs) for m in METRICS}
    if "A" in means and "B" in means:
        means["B/A"] = {
            m: (means["B"][m] / means["A"][m] if means["A"][m] else float("nan"))
            for m in METRICS
            if m != "errors"
        }
    return means


def table(args: argparse.Namespace, results: list[RunResult]) -> str:
    lines = [
        f"{args.workspaces} workspaces x {args.change_sets} change sets, {args.requests} requests, "
        f"{args.callers} callers on {args.connections} connection(s), {args.daemons} daemon(s), "
        f"{args.warmup} warm-up requests; CPU in seconds during the measured requests",
        "",
        "| run | callers | req/s | p50 ms | p99 ms | errors | nats-server CPU s | daemon CPU s | caller CPU s "
        "| foreign |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.round}{r.kind} | {r.label} | {r.rps:.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.errors} | "
            f"{r.server_cpu_s:.2f} | {r.daemons_cpu_s:.2f} | {r.callers_cpu_s:.2f} | {r.foreign_load:.0%} |"
        )
    means = summary(results)
    for kind, row in means.items():
        if kind == "B/A":
            lines.append(
                f"| **B/A** | | **{row['rps']:.3f}** | **{row['p50_ms']:.3f}** | **{row['p99_ms']:.3f}** | | "
                f"**{row['server_cpu_s']:.3f}** | **{row['daemons_cpu_s']:.3f}** | **{row['callers_cpu_s']:.3f}** | |"
            )
        else:
            lines.append(
                f"| mean {kind} | {KINDS[kind][0]} | {row['rps']:.0f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | "
                f"{row['errors']:g} | {row['server_cpu_s']:.2f} | {row['daemons_cpu_s']:.2f} | "
                f"{row['callers_cpu_s']:.2f} | |"
            )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[RunResult]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    rng = random.Random(args.seed)
    # The same plan in every run: each request's (workspace, change set).
    plan = [(rng.randrange(args.workspaces), rng.randrange(args.change_sets)) for _ in range(args.requests)]
    log_dir = Path(tempfile.mkdtemp(prefix="rebaser-bench-accounts-"))
    print(f"logs in {log_dir}", flush=True)
    results: list[RunResult] = []
    began = time.monotonic()
    for round_ in range(1, args.rounds + 1):
        for kind in KINDS:
            if time.monotonic() - began > args.total_timeout:
                print(f"--total-timeout {args.total_timeout:g}s reached: stopping", flush=True)
                return results
            log(f"round {round_}/{args.rounds}: {kind} ({KINDS[kind][0]})")
            result = await one_run(args, kind, round_, plan, log_dir)
            results.append(result)
            print(
                f"    {result.rps:.0f} req/s, p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, "
                f"{result.errors} errors, CPU s: nats-server {result.server_cpu_s:.2f}, daemons "
                f"{result.daemons_cpu_s:.2f}, callers {result.callers_cpu_s:.2f}; foreign load "
                f"{result.foreign_load:.0%}"
                + (f" (e.g. {result.first_errors[0]})" if result.first_errors else ""),
                flush=True,
            )
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of A then B (default 2: A, B, A, B)")
    parser.add_argument("--workspaces", type=int, default=200)
    parser.add_argument("--change-sets", type=int, default=2, help="change sets per workspace")
    parser.add_argument(
        "--callers", type=int, default=64, help="coroutines, each awaiting one reply at a time"
    )
    parser.add_argument("--requests", type=int, default=4000, help="measured requests per run")
    parser.add_argument(
        "--connections",
        type=int,
        default=1,
        help=f"NATS connections the callers share (at most {MAX_CONNECTIONS}: client-1's max_connections)",
    )
    parser.add_argument("--daemons", type=int, default=1)
    parser.add_argument("--app", default="", help="the daemons' --app (default: the daemon's default app)")
    parser.add_argument("--warmup", type=int, default=32, help="warm-up requests before measuring")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds one request may wait for its reply"
    )
    parser.add_argument("--run-timeout", type=float, default=600.0, help="seconds the measured part may take")
    parser.add_argument(
        "--ready-timeout", type=float, default=60.0, help="seconds a daemon may take to start"
    )
    parser.add_argument(
        "--total-timeout", type=float, default=3000.0, help="no new run starts after this many seconds"
    )
    parser.add_argument("--json", type=Path, help="also write the runs and the summary here")
    args = parser.parse_args(argv)
    for name in ("rounds", "workspaces", "change_sets", "callers", "requests", "connections", "daemons"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.connections > MAX_CONNECTIONS:
        parser.error(f"--connections must be at most {MAX_CONNECTIONS}")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        results = asyncio.run(main_async(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: every subprocess stopped", file=sys.stderr)
        return 130
    print()
    print(table(args, results))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                    "runs": [asdict(r) for r in results],
                    "summary": summary(results),
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
