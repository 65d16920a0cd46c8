"""The benchmark's command line (``python bench/bench.py --help``); ``bench/instructions.py`` takes it too."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rebaser_core.nats.durability import check_sync

__all__ = ["parse_args"]


def _sync(value: str) -> str | None:
    try:
        return check_sync(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="rebaser end-to-end benchmark (see the module docstring)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 3 requests per change set, a 1,000-change-set burst"
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=None,
        help="requests per scenario (default: --per-change-set x change sets)",
    )
    parser.add_argument(
        "--per-change-set",
        type=int,
        default=None,
        help="requests per change set, on average (default 10; quick 3)",
    )
    parser.add_argument("--clients", type=int, default=64, help="concurrent client coroutines")
    parser.add_argument("--daemons", default="1,2", help="comma-separated daemon/worker counts")
    parser.add_argument("--change-sets", default="100,1000", help="comma-separated change-set counts")
    parser.add_argument(
        "--impl",
        default="baseline,fair,rebaser,leases,nofeed,snapshots",
        help="comma-separated: baseline (the plain hand-written nats-py loop), fair (the hand-written loop on the "
        "daemon's lease, committing a record per request: the yardstick), rebaser (framework + CounterApp, at the "
        "defaults: the event feed on), leases (the same with lease_mode daemon), nofeed (the same with the event "
        "feed off), stream (the same with the events stream too), snapshots (framework + the default SnapshotApp)",
    )
    parser.add_argument(
        "--burst", type=int, default=None, help="change sets in the burst (default 10000; 0: no burst)"
    )
    parser.add_argument(
        "--dvu-requests", type=int, default=None, help="requests in the DVU burst (default 1000; 0: none)"
    )
    parser.add_argument(
        "--idle",
        type=int,
        default=None,
        help="change sets held idle in the idle-cost scenario (default 1000; quick 200; 0: none)",
    )
    parser.add_argument(
        "--idle-window", type=float, default=10.0, help="seconds the idle cost is measured over (and before)"
    )
    parser.add_argument("--quiescent", type=float, default=5.0, help="quiescent period, seconds")
    parser.add_argument(
        "--intake",
        choices=("fifo", "fair", "lanes"),
        default=None,
        help="the daemons' intake (REBASER_INTAKE; default: the daemons' default)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=2000,
        help="REBASER_CONCURRENCY per daemon (above the change-set count so the cap never binds; the burst "
        "uses at least its own size; the production default is 500)",
    )
    parser.add_argument(
        "--gc-stats",
        action="store_true",
        help="print the garbage collector's runs, time, longest pause and peak memory of each daemon",
    )
    parser.add_argument(
        "--cprofile",
        type=Path,
        default=None,
        metavar="DIR",
        help="run every daemon and worker under cProfile, one DIR/MODULE.PID.prof each (bench/cprof.py)",
    )
    parser.add_argument("--max-in-flight", type=int, default=1024, help="the rebaser client's max_in_flight")
    parser.add_argument(
        "--daemon-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for daemons/workers, e.g. REBASER_IDEMPOTENCY_WINDOW=16 (repeatable)",
    )
    parser.add_argument(
        "--logs",
        type=Path,
        default=None,
        help="keep every daemon's and worker's log in this directory (default: a temporary one, removed)",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="per-request reply timeout")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per scenario; the median-throughput run is reported"
    )
    parser.add_argument(
        "--sync",
        default="interval",
        type=_sync,
        help="the nats-server's sync_interval: always (fsync before every acknowledgement), a duration such as 1s, "
        "or interval (nats-server's default, 2m)",
    )
    parser.add_argument(
        "--count-syscalls",
        action="store_true",
        help="count nats-server's fsync and pwrite64 calls per request with strace (slows the server: a run for "
        "the counts, not for throughput; bench/syscalls.py)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here as JSON")
    parser.add_argument("--doc", type=Path, default=None, help="also write the ratios page here (Markdown)")
    args = parser.parse_args(argv)
    if args.per_change_set is None:
        args.per_change_set = 3 if args.quick else 10
    if args.burst is None:
        args.burst = 1000 if args.quick else 10_000
    if args.idle is None:
        args.idle = 200 if args.quick else 1000
    if args.dvu_requests is None:
        args.dvu_requests = 300 if args.quick else 1000
    args.argv = sys.argv[1:] if argv is None else list(argv)
    return args
