"""Fair share across workspaces: one workspace's flood against another's awaited requests (docs/fair-share.md).

    .venv/bin/python -m bench.fair_share [--flood 5000] [--per 5] [--b-requests 200] [--b-change-sets 20]

Workspace A enqueues ``--flood`` new change sets with ``--per`` requests each, not awaited; workspace B meanwhile
sends ``--b-requests`` requests over ``--b-change-sets`` change sets, each caller awaiting its reply. Three runs,
each on a fresh nats-server and one daemon (the no-op counter app):

- ``B alone``: B's latencies with nothing else;
- ``A + B, no share``: ``max_owned_per_workspace`` = ``concurrency`` (a workspace may take every slot);
- ``A + B, share``: the default share (half of ``concurrency``).

Other runs (``--runs``): the fair intake's, the many-tenant scenario (``tenants-*``), and ``bogus``/``bogus-fifo``,
where A publishes ``--bogus`` tasks for made-up change sets (no request) over ``--bogus-workspaces`` workspaces.

Reported: B's p50 and p99, A's drain time (from its first request to the last one applied), and the CPU seconds
nats-server and the daemon spent. Timings are for reading, not asserting (the test asserts the behaviour).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats
from nats.aio.client import Client as NatsClient

from bench.procs import Processes, cpu_seconds
from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.layout import LANES
from rebaser_core.subjects import Subjects, lane_of


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _one_run(
    args: argparse.Namespace,
    label: str,
    *,
    flood: bool,
    share: bool,
    intake: str,
    log_dir: Path,
    tenants: bool = False,
    bogus: bool = False,
) -> dict[str, object]:
    prefix = f"fs{os.getpid()}{label[:1]}{int(time.time() * 1000) % 100000}"
    with tempfile.TemporaryDirectory() as store, Processes(log_dir) as procs:
        server = NatsServer(store_dir=Path(store) / "nats")
        await asyncio.to_thread(server.start)
        try:
            env = {
                **os.environ,
                "REBASER_CONCURRENCY": str(args.concurrency),
                "REBASER_QUIESCENT_PERIOD": str(args.quiescent),
                "REBASER_MAX_OWNED_PER_WORKSPACE": "0" if share else str(args.concurrency),
                "REBASER_INTAKE": intake,
            }
            daemon = procs.spawn(
                f"{prefix}-daemon",
                [
                    sys.executable,
                    "-m",
                    "rebaser_server",
                    "--nats-url",
                    server.url,
                    "--prefix",
                    prefix,
                    "--app",
                    "rebaser_server.apps.counter:CounterApp",
                    "--http-port",
                    "-1",
                    "--log-level",
                    "WARNING",
                ],
                env,
            )
            await procs.wait_ready(daemon, "rebaser daemon serving")
            nc = await nats.connect(server.url)
            try:
                flooder = None
                if flood:
                    # A's flood comes from a process of its own, as another tenant's would: sending it from this
                    # process would put B's awaits in the queue of the flood's own event loop.
                    flooder = procs.spawn(
                        f"{prefix}-flood",
                        [
                            sys.executable,
                            "-m",
                            "bench.fair_share",
                            "--flood-worker",
                            f"{server.url} {prefix} {args.flood} {args.per}"
                            + (f" {args.bogus} {args.bogus_workspaces}" if bogus else ""),
                        ],
                        dict(os.environ),
                    )
                    await procs.wait_ready(flooder, "flooding")
                if tenants:
                    return await _tenants(args, nc, prefix, flooder=flooder, label=label)
                return await _traffic(
                    args, nc, prefix, server.pid or 0, daemon.pid, flooder=flooder, label=label, bogus=bogus
                )
            finally:
                await nc.close()
        finally:
            await asyncio.to_thread(server.stop)


async def _traffic(
    args: argparse.Namespace,
    nc: NatsClient,
    prefix: str,
    server_pid: int,
    daemon_pid: int,
    *,
    flooder: subprocess.Popen[bytes] | None,
    label: str,
    bogus: bool = False,
) -> dict[str, object]:
    client = RebaserClient(nc, prefix=prefix, max_in_flight=4096)
    b = WorkspacePk.new()
    print(f"  B's lane {lane_of(b, LANES)}", flush=True)  # (the lanes intake: A's is in the flood's log)
    cpu0 = cpu_seconds(server_pid), cpu_seconds(daemon_pid)
    started = time.monotonic()

    async def flood_sent() -> None:
        assert flooder is not None
        code = await asyncio.to_thread(flooder.wait)
        assert code == 0, f"the flood's process failed ({code})"

    async def flood_drained() -> float:
        js = nc.jetstream()
        subjects = Subjects(prefix)
        while True:
            if bogus:  # A's tasks are gone (B's too, once B is done)
                left = (await js.stream_info(subjects.tasks_stream)).state.messages
            else:  # only A's requests are left once B is done
                info = await js.stream_info(subjects.requests_stream, subjects_filter=subjects.requests_all)
                left = len(info.state.subjects or {})
            if not left and sent.done():
                return time.monotonic() - started
            await asyncio.sleep(0.2)  # polling the stream: the drain has no event to await

    latencies: list[float] = []

    async def b_caller(change_sets: list[ChangeSetId], count: int) -> None:
        for i in range(count):
            cs = change_sets[i % len(change_sets)]
            t = time.monotonic()
            reply = await client.enqueue_updates_with_reply(
                b, cs, [SetLiteral(path="/n", value=i)], timeout=120
            )
            assert reply.ok, reply
            latencies.append(time.monotonic() - t)

    flood = flooder is not None
    sent = asyncio.ensure_future(flood_sent() if flood else asyncio.sleep(0))
    if flood and args.b_after_sent:
        await (
            sent
        )  # B starts once all of A's flood is stored: the daemon's share alone, not the publishes' CPU
    elif flood:
        await asyncio.sleep(0.5)  # B starts once the flood is under way (its pacing, not a wait for a result)
    b_sets = [ChangeSetId.new() for _ in range(args.b_change_sets)]
    callers = min(10, args.b_change_sets)  # each caller its own change sets: one request at a time on each
    await asyncio.gather(*(b_caller(b_sets[i::callers], args.b_requests // callers) for i in range(callers)))
    b_done = time.monotonic() - started
    drain = await flood_drained() if flood else None
    await sent
    cpu1 = cpu_seconds(server_pid), cpu_seconds(daemon_pid)
    result = {
        "run": label,
        "b_p50_ms": round(_quantile(latencies, 0.5) * 1000, 1),
        "b_p99_ms": round(_quantile(latencies, 0.99) * 1000, 1),
        "b_done_s": round(b_done, 1),
        "a_drain_s": None if drain is None else round(drain, 1),
        "server_cpu_s": round(cpu1[0] - cpu0[0], 1),
        "daemon_cpu_s": round(cpu1[1] - cpu0[1], 1),
    }
    print(result, flush=True)
    return result


# (label, A floods, the per-daemon share on, intake)
RUNS = {
    "alone": ("B alone", False, True, "fifo"),
    "fifo": ("A + B, fifo, no share", True, False, "fifo"),
    "share": ("A + B, fifo, share", True, True, "fifo"),
    "fair-alone": ("B alone, fair intake", False, True, "fair"),
    "fair": ("A + B, fair intake", True, True, "fair"),
    "lanes-alone": ("B alone, lanes intake", False, True, "lanes"),
    "lanes": ("A + B, lanes intake", True, True, "lanes"),
}
# A's flood is --bogus tasks for made-up change sets (over --bogus-workspaces made-up workspaces), no requests.
BOGUS_RUNS = {
    "bogus-fifo": ("A's bogus tasks + B, fifo, share", True, True, "fifo"),
    "bogus": ("A's bogus tasks + B, fair intake", True, True, "fair"),
    "bogus-lanes": ("A's bogus tasks + B, lanes intake", True, True, "lanes"),
}
# The many-tenant scenario (--tenants): the small workspaces alone, then beside the flood.
TENANT_RUNS = {
    "tenants-fifo-alone": ("tenants alone, fifo", False, True, "fifo"),
    "tenants-fifo": ("tenants + A, fifo, share", True, True, "fifo"),
    "tenants-fair-alone": ("tenants alone, fair intake", False, True, "fair"),
    "tenants-fair": ("tenants + A, fair intake", True, True, "fair"),
    "tenants-lanes-alone": ("tenants alone, lanes intake", False, True, "lanes"),
    "tenants-lanes": ("tenants + A, lanes intake", True, True, "lanes"),
}


async def _tenants(
    args: argparse.Namespace,
    nc: NatsClient,
    prefix: str,
    *,
    flooder: subprocess.Popen[bytes] | None,
    label: str,
) -> dict[str, object]:
    """``--tenants`` small workspaces, the i-th with 1..50 change sets, each change set sent ``--tenant-requests``
    awaited requests one after the other, all workspaces at once: each workspace's p99 (ms) by its index."""
    client = RebaserClient(nc, prefix=prefix, max_in_flight=4096)
    if flooder is not None:
        await asyncio.sleep(0.5)  # the flood is under way (its pacing, not a wait for a result)
    by_workspace: dict[int, list[float]] = {}

    async def workspace(index: int) -> None:
        wk = WorkspacePk.new()
        count = 1 + index * 49 // max(1, args.tenants - 1)
        latencies = by_workspace.setdefault(index, [])

        async def change_set() -> None:
            cs = ChangeSetId.new()
            for n in range(args.tenant_requests):
                t = time.monotonic()
                reply = await client.enqueue_updates_with_reply(
                    wk, cs, [SetLiteral(path="/n", value=n)], timeout=120
                )
                assert reply.ok, reply
                latencies.append(time.monotonic() - t)

        await asyncio.gather(*(change_set() for _ in range(count)))

    await asyncio.gather(*(workspace(i) for i in range(args.tenants)))
    if flooder is not None:
        await asyncio.to_thread(flooder.wait)
    p99 = {i: round(_quantile(v, 0.99) * 1000, 1) for i, v in sorted(by_workspace.items())}
    result: dict[str, object] = {"run": label, "p99_ms_by_workspace": p99}
    print(result, flush=True)
    return result


async def _bogus_worker(url: str, prefix: str, count: int, workspaces: int) -> None:
    """``count`` tasks for made-up change sets over ``workspaces`` made-up workspaces, with no request: plain
    publishes, as fast as the connection takes them (as a hostile caller would, not waiting for acks)."""
    nc = await nats.connect(url)
    subjects = Subjects(prefix)
    made_up = [WorkspacePk.new() for _ in range(max(1, workspaces))]
    print("flooding", flush=True)
    for i in range(count):
        await nc.publish(subjects.task(made_up[i % len(made_up)], ChangeSetId.new()), b"")
        if i % 1000 == 999:
            await nc.flush()
    await nc.flush()
    await nc.close()


async def _flood_worker(spec: str) -> None:
    """The flood's own process: A's change sets, ``per`` requests each, by 32 senders, not awaited (or, with two
    more fields, bogus tasks: see _bogus_worker)."""
    url, prefix, count, per, *bogus = spec.split()
    if bogus:
        await _bogus_worker(url, prefix, int(bogus[0]), int(bogus[1]))
        return
    nc = await nats.connect(url)
    client = RebaserClient(nc, prefix=prefix, max_in_flight=4096)
    a = WorkspacePk.new()
    change_sets = [ChangeSetId.new() for _ in range(int(count))]
    it = iter([(cs, n) for n in range(int(per)) for cs in change_sets])
    print(f"flooding (A's lane {lane_of(a, LANES)})", flush=True)

    async def sender() -> None:
        for cs, n in it:
            await client.enqueue_updates(a, cs, [SetLiteral(path="/n", value=n)])

    await asyncio.gather(*(sender() for _ in range(32)))
    await nc.close()


async def main_async(args: argparse.Namespace) -> list[dict[str, object]]:
    log_dir = Path(tempfile.mkdtemp(prefix="rebaser-fair-share-"))
    results = []
    for name in args.runs.split(","):
        tenants, bogus = name in TENANT_RUNS, name in BOGUS_RUNS
        label, flood, share, intake = {**RUNS, **TENANT_RUNS, **BOGUS_RUNS}[name]
        results.append(
            await _one_run(
                args,
                label,
                flood=flood,
                share=share,
                intake=intake,
                log_dir=log_dir,
                tenants=tenants,
                bogus=bogus,
            )
        )
    return results


def _tenant_table(results: list[dict[str, object]]) -> None:
    """Each flooded run's worst ratio of a small workspace's p99 to its p99 in the alone run of the same intake."""
    by_label = {str(r["run"]): r for r in results}
    print("\n| intake | small workspaces within 4x alone | worst ratio | worst p99 ms (alone) |")
    print("|---|---|---|---|")
    for intake, alone, flooded in (
        ("fifo", "tenants alone, fifo", "tenants + A, fifo, share"),
        ("fair", "tenants alone, fair intake", "tenants + A, fair intake"),
        ("lanes", "tenants alone, lanes intake", "tenants + A, lanes intake"),
    ):
        if alone not in by_label or flooded not in by_label:
            continue
        base = by_label[alone]["p99_ms_by_workspace"]
        under = by_label[flooded]["p99_ms_by_workspace"]
        assert isinstance(base, dict) and isinstance(under, dict)
        ratios = {i: under[i] / max(base[i], 0.1) for i in base}
        worst = max(ratios, key=lambda i: ratios[i])
        within = sum(1 for r in ratios.values() if r <= 4)
        print(
            f"| {intake} | {within} of {len(ratios)} | {ratios[worst]:.1f} | {under[worst]} ({base[worst]}) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood", type=int, default=5000, help="workspace A's new change sets")
    parser.add_argument("--per", type=int, default=5, help="requests per change set of A")
    parser.add_argument("--b-requests", type=int, default=200)
    parser.add_argument("--b-change-sets", type=int, default=20)
    parser.add_argument(
        "--concurrency", type=int, default=500, help="REBASER_CONCURRENCY (the production default)"
    )
    parser.add_argument("--quiescent", type=float, default=2.0, help="REBASER_QUIESCENT_PERIOD")
    parser.add_argument(
        "--runs",
        default="alone,fifo,share,fair-alone,fair",
        help=f"which runs, in order, comma-separated: {', '.join([*RUNS, *TENANT_RUNS, *BOGUS_RUNS])}",
    )
    parser.add_argument(
        "--b-after-sent",
        action="store_true",
        help="B starts once A's flood is all published (else half a second into it)",
    )
    parser.add_argument("--bogus", type=int, default=100_000, help="bogus tasks of the bogus runs")
    parser.add_argument(
        "--bogus-workspaces", type=int, default=1, help="made-up workspaces the bogus tasks are spread over"
    )
    parser.add_argument("--tenants", type=int, default=49, help="small workspaces of the many-tenant runs")
    parser.add_argument("--tenant-requests", type=int, default=4, help="awaited requests per change set")
    parser.add_argument("--flood-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flood_worker:
        asyncio.run(_flood_worker(args.flood_worker))
        return
    results = asyncio.run(main_async(args))
    if any("p99_ms_by_workspace" in r for r in results):
        _tenant_table(results)
        results = [r for r in results if "p99_ms_by_workspace" not in r]
        if not results:
            return
    print("\n| run | B p50 ms | B p99 ms | A drain s | nats-server CPU s | daemon CPU s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['run']} | {r['b_p50_ms']} | {r['b_p99_ms']} | {r['a_drain_s'] or '-'} | "
            f"{r['server_cpu_s']} | {r['daemon_cpu_s']} |"
        )


if __name__ == "__main__":
    main()
