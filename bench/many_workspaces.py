"""The same awaited load in one workspace and spread over many, on the compose-shaped cluster (issue 61).

    .venv/bin/python -m bench.many_workspaces [--change-sets 2000] [--requests 2] [--callers 64] [--quiet 20]
                                              [--daemons 2] [--json PATH] [--markdown PATH] [--smoke]

Each scenario starts a fresh cluster shaped like docker-compose.yml (and ``rebaser-server dev-cluster``): three
routed nats-server nodes on 127.0.0.1 (:class:`~rebaser_core.embedded.NatsCluster`, ``sync_interval: always`` as
deploy/nats.conf, ``--sync`` to change it) and ``--daemons`` daemon processes (``python -m rebaser_server
--nats-url ... --nats-url ...``) with ``REBASER_REPLICAS=3`` and every other setting at its default (the default
app, intake, periods and limits; no other ``REBASER_*`` variable reaches them). Then ``--callers`` coroutines in
this process, sharing one public client (:class:`rebaser_client.RebaserClient`, its defaults) on one connection
that knows every node, take the change sets one at a time and send each ``--requests`` requests one after the
other with ``enqueue_updates_with_reply``, awaiting each reply:

- ``one``: all ``--change-sets`` change sets in ONE workspace;
- ``many``: the same number of change sets spread over as many workspaces (one change set each).

Reported per scenario, and many/one: throughput (replies / wall time), p50 and p99 latency, errors by exception
class (a timeout, ``--timeout`` s per request, is one; so is every request still unanswered when ``--max-seconds``
runs out), the CPU seconds the NATS nodes, the daemons and this process spent during the run (/proc), the durable
consumers on the tasks stream after the run, the NATS nodes' resident memory after it, and their (and the daemons')
CPU in ``--quiet`` seconds of quiet after it; the ``backlog`` queries the daemons answered when their /metrics
count them (the row is left out when no such counter exists). Timings are for reading, not asserting: a shared
2-core machine moves them by 10-20 % from run to run (``foreign`` says how busy the rest of the machine was).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nats
from nats.aio.client import Client as NatsClient

from bench.procs import REPO, Processes, rss_kb
from bench.workload import CpuMeter, ms
from rebaser_client import RebaserClient
from rebaser_core.api import SetLiteral
from rebaser_core.embedded import NatsCluster
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.subjects import Subjects

NODES = 3  # as docker-compose.yml and the dev cluster
SERVING = "rebaser daemon serving"
HEALTH = re.compile(r"health endpoint on (http://\S+)")
SCENARIOS = ("one", "many")
SMOKE = {"change_sets": 20, "requests": 1, "callers": 4, "quiet": 1.0, "daemons": 1}
DEFAULTS = {"change_sets": 2000, "requests": 2, "callers": 64, "quiet": 20.0, "daemons": 2}
# The part of --max-seconds kept per scenario for starting and stopping its cluster and daemons (and its quiet).
OVERHEAD_S = 45.0


@dataclass
class ScenarioResult:
    scenario: str  # "one" or "many"
    label: str
    workspaces: int
    change_sets: int
    requests: int
    ok: int
    errors: int
    errors_by_class: dict[str, int]
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    nats_cpu_s: float  # the 3 nodes, during the run
    daemons_cpu_s: float
    client_cpu_s: float
    foreign_load: float  # the share of the machine other processes used during the run
    consumers_after: int  # durable consumers on the tasks stream right after the run (-1: not read)
    consumers_after_quiet: int
    nats_rss_mb: float  # the 3 nodes, right after the run
    nats_rss_mb_after_quiet: float
    quiet_s: float
    nats_quiet_cpu_pct: float  # % of one core, the 3 nodes together, in the quiet after the run
    daemons_quiet_cpu_pct: float
    backlog_queries: int | None  # answered by the daemons (their /metrics), None: no such counter
    deadline_reached: bool
    first_errors: list[str] = field(default_factory=list)


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def daemon_env(intake: str | None = None, lease_mode: str | None = None) -> dict[str, str]:
    """This process's environment without any REBASER_* setting, plus REBASER_REPLICAS=3 (as the dev cluster),
    ``intake`` if given (REBASER_INTAKE) and ``lease_mode`` if given (REBASER_LEASE_MODE)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REBASER_")}
    env["REBASER_REPLICAS"] = str(NODES)
    if intake:
        env["REBASER_INTAKE"] = intake
    if lease_mode:
        env["REBASER_LEASE_MODE"] = lease_mode
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return env


def daemon_command(cluster: NatsCluster) -> list[str]:
    """What the dev cluster runs (rebaser_server/devtools/devcluster.py), with the default app and log settings."""
    command = [sys.executable, "-m", "rebaser_server"]
    command += [arg for url in cluster.urls for arg in ("--nats-url", url)]
    command += [
        arg for n in cluster.nodes if n.monitoring_url for arg in ("--nats-monitoring-url", n.monitoring_url)
    ]
    # A health endpoint on a free loopback port each: where /metrics is read.
    return [*command, "--http-host", "127.0.0.1", "--http-port", "0"]


def plan(scenario: str, change_sets: int) -> list[tuple[WorkspacePk, ChangeSetId]]:
    if scenario == "one":
        workspace = WorkspacePk.new()
        return [(workspace, ChangeSetId.new()) for _ in range(change_sets)]
    return [(WorkspacePk.new(), ChangeSetId.new()) for _ in range(change_sets)]


def error_class(err: BaseException) -> str:
    return type(err).__name__


async def count_durable_consumers(nc: NatsClient, stream: str) -> int:
    """Durable consumers on ``stream`` (the consumer list comes in pages of 256); -1 if it could not be read."""
    js = nc.jetstream(timeout=30.0)
    total, offset = 0, 0
    try:
        while True:
            page = await js.consumers_info(stream, offset=offset or None)
            if not page:
                return total
            total += sum(1 for info in page if info.config.durable_name)
            offset += len(page)
    except Exception as err:
        log(f"  could not list the consumers of {stream}: {error_class(err)}: {err}")
        return -1


def read_backlog_queries(urls: list[str]) -> int | None:
    """The ``backlog`` queries the daemons answered, summed from their /metrics: every sample of a query counter
    (a metric named ``*quer*`` with ``backlog`` among its labels). None if no daemon has one."""
    total, found = 0.0, False
    for url in urls:
        try:
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
                text = response.read().decode(errors="replace")
        except OSError as err:
            log(f"  could not read {url}/metrics: {err}")
            continue
        for line in text.splitlines():
            if line.startswith("#") or "{" not in line:
                continue
            name, rest = line.split("{", 1)
            labels, _, value = rest.rpartition("}")
            if "quer" in name and name.endswith(("_total", "_count")) and '"backlog"' in labels:
                with contextlib.suppress(ValueError):
                    total += float(value.split()[0])
                    found = True
    return int(total) if found else None


async def run_scenario(
    args: argparse.Namespace, scenario: str, log_dir: Path, run_deadline: float
) -> ScenarioResult:
    """A fresh cluster and daemons; the scenario's requests; what it cost; everything stopped again."""
    targets = plan(scenario, args.change_sets)
    workspaces = len({wk for wk, _ in targets})
    label = "one workspace" if scenario == "one" else f"{workspaces} workspaces"
    with (
        tempfile.TemporaryDirectory(prefix="rebaser-many-workspaces-") as store,
        Processes(log_dir) as procs,
    ):
        # Started from this (the main) thread, with the parent-death signal: no node outlives a killed run.
        cluster = NatsCluster(
            NODES, base_dir=Path(store) / "nats", die_with_parent=True, sync=args.sync or None
        )
        nc: NatsClient | None = None
        client: RebaserClient | None = None
        try:
            cluster.start(timeout=60)  # blocks until JetStream can place R3 streams: nothing else runs yet
            nats_pids = [n.pid or 0 for n in cluster.nodes]
            command, env = daemon_command(cluster), daemon_env(args.intake, args.lease_mode)
            daemons = [
                procs.spawn(f"{scenario}-daemon-{i}", command, env) for i in range(1, args.daemons + 1)
            ]
            for proc in daemons:
                await procs.wait_ready(proc, SERVING, timeout=args.ready_timeout)
            http_urls = [m.group(1) for p in daemons if (m := HEALTH.search(procs.log_of(p)))]
            log(
                f"{label}: NATS pids {nats_pids}, daemon pids {[p.pid for p in daemons]}; "
                f"{len(targets)} change sets x {args.requests} requests, {args.callers} callers"
            )
            nc = await nats.connect(servers=cluster.urls, connect_timeout=5)
            client = RebaserClient(nc)
            await client.start()  # reads the shard layout: not part of the timed run

            latencies: list[float] = []
            errors: Counter[str] = Counter()
            first_errors: list[str] = []
            todo: Iterator[tuple[WorkspacePk, ChangeSetId]] = iter(targets)

            async def caller() -> None:
                assert client is not None
                for workspace, change_set in todo:
                    for n in range(args.requests):
                        started = time.perf_counter()
                        try:
                            reply = await client.enqueue_updates_with_reply(
                                workspace, change_set, [SetLiteral(path="/n", value=n)], timeout=args.timeout
                            )
                        except Exception as err:
                            errors[error_class(err)] += 1
                            if len(first_errors) < 5:
                                first_errors.append(f"{error_class(err)}: {err}"[:300])
                            continue
                        if reply.ok:
                            latencies.append(time.perf_counter() - started)
                        else:
                            errors[f"reply {type(reply.status).__name__}"] += 1
                            if len(first_errors) < 5:
                                first_errors.append(f"unsuccessful reply: {reply.status!r}"[:300])

            # Every scenario still to run gets its part of the time left, less what starting and stopping its
            # cluster and its quiet take.
            remaining = len(args.scenarios) - args.scenarios.index(scenario)
            budget = max(10.0, (run_deadline - time.monotonic()) / remaining - OVERHEAD_S - args.quiet)
            meter = CpuMeter(
                {"nats": nats_pids, "daemons": [p.pid for p in daemons], "client": [os.getpid()]}
            )
            began = time.perf_counter()
            deadline_reached = False
            try:
                async with asyncio.timeout(budget):
                    await asyncio.gather(*(caller() for _ in range(min(args.callers, len(targets)))))
            except TimeoutError:
                deadline_reached = True
            seconds = time.perf_counter() - began
            meter.stop(seconds)
            total = len(targets) * args.requests
            unanswered = total - len(latencies) - sum(errors.values())
            if unanswered:
                errors["MaxSecondsReached"] += unanswered
                log(f"  --max-seconds: {unanswered} requests unanswered after {budget:.0f} s")
            for proc in daemons:
                if proc.poll() is not None:
                    errors["DaemonExited"] += 1
                    log(f"  daemon {proc.pid} exited ({proc.returncode}) during the run")

            tasks_stream = Subjects(None).tasks_stream
            consumers_after = await count_durable_consumers(nc, tasks_stream)
            nats_rss = sum(rss_kb(pid) for pid in nats_pids) / 1024
            quiet = CpuMeter({"nats": nats_pids, "daemons": [p.pid for p in daemons]})
            await asyncio.sleep(args.quiet)
            quiet.stop(args.quiet)
            consumers_after_quiet = await count_durable_consumers(nc, tasks_stream)
            nats_rss_quiet = sum(rss_kb(pid) for pid in nats_pids) / 1024
            backlog_queries = await asyncio.to_thread(read_backlog_queries, http_urls)
        finally:
            if client is not None:
                await client.close()
            if nc is not None:
                with contextlib.suppress(Exception):
                    await nc.close()
            for started, _ in list(procs.procs.values()):  # the daemons, by PID, before the NATS nodes
                await procs.stop(started)
            cluster.stop(timeout=10)  # SIGKILLs a node that does not stop in time
    ok = len(latencies)
    return ScenarioResult(
        scenario=scenario,
        label=label,
        workspaces=workspaces,
        change_sets=len(targets),
        requests=total,
        ok=ok,
        errors=sum(errors.values()),
        errors_by_class=dict(errors.most_common()),
        seconds=round(seconds, 2),
        rps=round(ok / seconds, 1) if seconds > 0 else 0.0,
        p50_ms=ms(latencies, 0.50),
        p99_ms=ms(latencies, 0.99),
        nats_cpu_s=round(meter.used["nats"], 2),
        daemons_cpu_s=round(meter.used["daemons"], 2),
        client_cpu_s=round(meter.used["client"], 2),
        foreign_load=meter.foreign,
        consumers_after=consumers_after,
        consumers_after_quiet=consumers_after_quiet,
        nats_rss_mb=round(nats_rss, 1),
        nats_rss_mb_after_quiet=round(nats_rss_quiet, 1),
        quiet_s=args.quiet,
        nats_quiet_cpu_pct=round(quiet.used["nats"] / args.quiet * 100, 1) if args.quiet else 0.0,
        daemons_quiet_cpu_pct=round(quiet.used["daemons"] / args.quiet * 100, 1) if args.quiet else 0.0,
        backlog_queries=backlog_queries,
        deadline_reached=deadline_reached,
        first_errors=first_errors,
    )


def _ratio(many: float | None, one: float | None) -> str:
    if many is None or one is None or not one or one != one or many != many:  # none, zero or NaN
        return "-"
    return f"{many / one:.2f}"


def _errors(r: ScenarioResult) -> str:
    if not r.errors:
        return "0"
    return f"{r.errors} ({', '.join(f'{k} {v}' for k, v in r.errors_by_class.items())})"


def table(args: argparse.Namespace, results: list[ScenarioResult]) -> str:
    """The markdown table: a column per scenario, and many/one when both ran."""
    by = {r.scenario: r for r in results}
    cols = [by[s] for s in SCENARIOS if s in by]
    both = "one" in by and "many" in by
    header = "| |" + "".join(f" {r.label} |" for r in cols) + (" ratio |" if both else "")
    lines = [
        f"{args.change_sets} change sets x {args.requests} awaited requests, {args.callers} callers (one public "
        f"client), {args.daemons} daemons (REBASER_REPLICAS=3, the rest default), {NODES} NATS nodes "
        f"(sync {args.sync or 'default'}); a fresh cluster per scenario; foreign load "
        + ", ".join(f"{r.label} {r.foreign_load:.0%}" for r in cols),
        "",
        header,
        "|---|" + "---|" * (len(cols) + (1 if both else 0)),
    ]

    def row(name: str, cell: str, value: str | None = None) -> None:
        cells = [format(getattr(r, cell) if value is None else value.format(r=r)) for r in cols]
        ratio = ""
        if both and value is None:
            ratio = f" {_ratio(getattr(by['many'], cell), getattr(by['one'], cell))} |"
        elif both:
            ratio = " - |"
        lines.append(f"| {name} |" + "".join(f" {c} |" for c in cells) + ratio)

    row("throughput (req/s)", "rps")
    cells = [f"{r.p50_ms:.1f} / {r.p99_ms:.1f}" for r in cols]
    ratio = (
        f" {_ratio(by['many'].p50_ms, by['one'].p50_ms)} / {_ratio(by['many'].p99_ms, by['one'].p99_ms)} |"
    )
    lines.append("| p50 / p99 latency (ms) |" + "".join(f" {c} |" for c in cells) + (ratio if both else ""))
    lines.append("| errors |" + "".join(f" {_errors(r)} |" for r in cols) + (" - |" if both else ""))
    row("wall time of the run (s)", "seconds")
    row(f"NATS CPU s during the run ({NODES} nodes)", "nats_cpu_s")
    row(f"daemon CPU s during the run ({args.daemons} daemons)", "daemons_cpu_s")
    row("client CPU s during the run (this process)", "client_cpu_s")
    row("durable consumers on the tasks stream after the run", "consumers_after")
    row(f"... and after {args.quiet:g} s of quiet", "consumers_after_quiet")
    row(f"NATS memory after the run (MB, {NODES} nodes)", "nats_rss_mb")
    row(f"NATS CPU % of a core in {args.quiet:g} s of quiet after", "nats_quiet_cpu_pct")
    row(f"daemon CPU % of a core in {args.quiet:g} s of quiet after", "daemons_quiet_cpu_pct")
    if any(r.backlog_queries is not None for r in cols):
        row("backlog queries the daemons answered", "backlog_queries")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[ScenarioResult]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    log_dir = Path(tempfile.mkdtemp(prefix="rebaser-bench-many-workspaces-"))
    log(f"daemon logs in {log_dir}")
    run_deadline = time.monotonic() + args.max_seconds
    results: list[ScenarioResult] = []
    for scenario in args.scenarios:
        result = await run_scenario(args, scenario, log_dir, run_deadline)
        results.append(result)
        log(
            f"  {result.label}: {result.rps:.0f} req/s, p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, "
            f"{_errors(result)} errors, {result.seconds:.1f} s; CPU s: NATS {result.nats_cpu_s:.1f}, daemons "
            f"{result.daemons_cpu_s:.1f}; {result.consumers_after} durable consumers"
            + (f" (e.g. {result.first_errors[0]})" if result.first_errors else "")
        )
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--change-sets", type=int, help=f"C: change sets per scenario (default {DEFAULTS['change_sets']})"
    )
    parser.add_argument(
        "--requests", type=int, help=f"R: awaited requests per change set (default {DEFAULTS['requests']})"
    )
    parser.add_argument(
        "--callers",
        type=int,
        help=f"K: concurrent callers, one reply awaited each (default {DEFAULTS['callers']})",
    )
    parser.add_argument(
        "--quiet",
        type=float,
        help=f"Q: seconds of quiet measured after the run (default {DEFAULTS['quiet']:g})",
    )
    parser.add_argument("--daemons", type=int, help="daemon processes (default 2)")
    parser.add_argument(
        "--intake",
        choices=("fifo", "fair", "lanes"),
        help="the daemons' intake (REBASER_INTAKE; default: the default's)",
    )
    parser.add_argument(
        "--lease-mode",
        choices=("task", "daemon"),
        help="the daemons' lease mode (REBASER_LEASE_MODE; default: the default's)",
    )
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="which scenarios, in order: one, many (default both)"
    )
    parser.add_argument(
        "--sync",
        default="always",
        help="the NATS nodes' sync_interval: always (deploy/nats.conf, the dev cluster), a duration, or '' for "
        "nats-server's default",
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds one request may wait for its reply"
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=1800.0,
        help="the whole run's bound: each scenario's requests get their part of it; unanswered ones count as errors",
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=90.0, help="seconds a daemon may take to start"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a CI-sized run: C=20, R=1, K=4, Q=1, one daemon (flags given explicitly still win)",
    )
    parser.add_argument("--json", type=Path, help="also write the settings and results here")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    for name, default in (SMOKE if args.smoke else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    for name in ("change_sets", "requests", "callers", "daemons"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.quiet < 0 or args.timeout <= 0 or args.max_seconds <= 0:
        parser.error("--quiet must not be negative; --timeout and --max-seconds must be positive")
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if not args.scenarios or any(s not in SCENARIOS for s in args.scenarios):
        parser.error(f"--scenarios: a comma-separated list of {', '.join(SCENARIOS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "bench.many_workspaces", *(sys.argv[1:] if argv is None else argv)])
    try:
        results = asyncio.run(main_async(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: every process it started is stopped", file=sys.stderr)
        return 130
    text = table(args, results)
    print()
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(f"`{command}`\n\n{text}\n")
    if args.json is not None:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        args.json.write_text(
            json.dumps(
                {"command": command, "settings": settings, "results": [asdict(r) for r in results]}, indent=2
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
