"""A long steady load on one daemon, its memory sampled: does the daemon's RSS stay flat once warm?

    .venv/bin/python -m bench.soak --minutes 60 --lease-mode task
    .venv/bin/python -m bench.soak --minutes 60 --lease-mode daemon
    .venv/bin/python -m bench.soak --minutes 10 --tracemalloc     # the daemon in this process: what grows, by line

``--clients`` callers (32) each send one awaited request after another to a change set drawn from a pool of
``--change-sets`` (5,000), with the snapshot app (five attributes per change set, so that what the change sets hold
stops growing within minutes), to a daemon on a fresh nats-server. Every ``--sample`` seconds the daemon's RSS
(``VmRSS``) is printed, and nats-server's; at the end, the RSS after ``--warmup`` minutes: its first and last sample,
the spread, and the least-squares slope in MB a minute. ``make soak`` runs an hour in each lease mode.

With ``--tracemalloc`` the daemon runs in this process (the RSS is then the clients' too) and each sample prints the
ten source lines whose allocations grew most since the end of the warm-up (the clients' and tracemalloc's own left
out), then the types of object whose number grew most (coroutines by name) and what holds a sample of the first:
what keeps growing stands out after a few minutes. Each sample also gives what the daemon's code holds in all, by
the part of the code that allocated it (a sub-package, a library, a standard module): where the RSS goes.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import importlib.util
import os
import random
import signal
import sys
import tempfile
import time
import tracemalloc
import types
from collections.abc import AsyncIterator
from pathlib import Path

import nats

from bench.procs import Processes
from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings

APP = "rebaser_server.apps.snapshots:SnapshotApp"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minute, MB) points, MB a minute."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


@contextlib.asynccontextmanager
async def daemon_process(args: argparse.Namespace, url: str, prefix: str, logs: Path) -> AsyncIterator[int]:
    await asyncio.to_thread(logs.mkdir, parents=True, exist_ok=True)
    with Processes(logs) as procs:
        env = {**os.environ, "REBASER_LEASE_MODE": args.lease_mode, "REBASER_STORAGE": "memory"}
        command = [sys.executable, "-m", "rebaser_server", "--nats-url", url, "--prefix", prefix]
        command += ["--app", args.app, "--http-port", "-1", "--log-level", "WARNING"]
        daemon = procs.spawn(f"{prefix}-daemon", command, env)
        await procs.wait_ready(daemon, "rebaser daemon serving")
        yield daemon.pid


@contextlib.asynccontextmanager
async def daemon_here(args: argparse.Namespace, url: str, prefix: str) -> AsyncIterator[int]:
    from rebaser_server.apps.snapshots import SnapshotApp
    from rebaser_server.testing import running_daemon

    settings = Settings(prefix=prefix, storage="memory", lease_mode=args.lease_mode)
    nc = await nats.connect(url)
    try:
        async with running_daemon(nc, settings, SnapshotApp()):
            yield os.getpid()
    finally:
        await nc.close()


def daemon_snapshot() -> tracemalloc.Snapshot:
    """What the daemon's code holds now (tracemalloc's own, the clients' and this script's left out)."""
    return tracemalloc.take_snapshot().filter_traces(
        [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "*/rebaser_client/*"),
            tracemalloc.Filter(False, "*/bench/*"),
        ]
    )


def object_counts() -> collections.Counter[str]:
    """How many objects the garbage collector tracks, by type (what a leak of whole objects shows as)."""
    return collections.Counter(_kind(o) for o in gc.get_objects())


def _kind(o: object) -> str:
    if isinstance(o, types.CoroutineType):
        return f"coroutine {o.__qualname__}"  # which coroutines pile up, not only that they do
    return f"{type(o).__module__}.{type(o).__qualname__}"


def counts_grown(since: collections.Counter[str], top: int = 8) -> list[str]:
    """The types whose objects grew most in number since ``since``, and for the first, what holds 200 of them."""
    grown = object_counts()
    grown.subtract(since)
    lines = [f"    +{n} {kind}" for kind, n in grown.most_common(top) if n > 0]
    if lines:
        lines.append(f"    held by: {holders(grown.most_common(1)[0][0])}")
    return lines


def holders(kind: str, sample: int = 200) -> str:
    """What refers to ``sample`` objects of ``kind`` (picked at random): the types of their referrers, counted."""
    objects = [o for o in gc.get_objects() if _kind(o) == kind]
    picked = random.Random(0).sample(objects, min(sample, len(objects)))
    del objects
    found: collections.Counter[str] = collections.Counter()
    for o in picked:
        for referrer in gc.get_referrers(o):
            if referrer is picked or isinstance(referrer, types.FrameType):
                continue
            found[_kind(referrer)] += 1
    return ", ".join(f"{n} {k}" for k, n in found.most_common(6))


def by_part(snapshot: tracemalloc.Snapshot, top: int = 10) -> str:
    """What ``snapshot`` holds by the part of the code that allocated it: a sub-package of this project
    (``rebaser_server.changeset``: the owned change sets' state), a library (``nats``: messages received and not yet
    handled, its buffers) or a standard module (``asyncio``); where the RSS goes, not only what grows."""
    held: collections.Counter[str] = collections.Counter()
    for stat in snapshot.statistics("filename"):
        held[_part(stat.traceback[0].filename)] += stat.size
    return ", ".join(f"{part} {size / 2**20:.1f}" for part, size in held.most_common(top))


def _part(filename: str) -> str:
    path = Path(filename).parts
    for marker in ("rebaser_server", "rebaser_core"):
        if marker in path:
            at = path.index(marker)
            inner = list(path[at + 1 : -1]) or [Path(filename).stem]
            return ".".join((marker, *inner[:1]))
    if "site-packages" in path:
        return path[path.index("site-packages") + 1].split(".")[0]
    if len(path) < 2:  # "<frozen ...>", "<unknown>"
        return filename
    package = path[-2]
    return f"stdlib {Path(filename).stem if package == 'lib' or package.startswith('python') else package}"


def growth(since: tracemalloc.Snapshot, top: int = 10, frames: int = 1) -> list[str]:
    """The total the daemon's code holds, then the ``top`` source lines whose allocations grew most since ``since``
    (with ``frames`` > 1, the call stacks of the first three): a total that stays flat while the RSS grows is the
    allocator's fragmentation, not a leak."""
    now = daemon_snapshot()
    total = sum(trace.size for trace in now.traces) / 2**20
    lines = [f"    traced {total:.1f} MB: {by_part(now)}"]
    if frames > 1:
        for stat in now.compare_to(since, "traceback")[:3]:
            lines += [f"    {stat}", *(f"        {line}" for line in stat.traceback.format())]
    return lines + [f"    {stat}" for stat in now.compare_to(since, "lineno")[:top]]


async def held_by_jetstream(nc: nats.aio.client.Client) -> str:
    """What nats-server's JetStream holds for the account: the bytes of its streams in memory and on disk, and its
    streams and consumers (what bounds the server's memory besides Go's own)."""
    try:
        info = await nc.jetstream().account_info()
    except Exception as err:  # a sample without it, not a failed run
        return f"  jetstream ? ({type(err).__name__})"
    return (
        f"  jetstream {info.memory / 2**20:6.1f} MB in memory, {info.storage / 2**20:6.1f} MB stored, "
        f"{info.streams} streams, {info.consumers} consumers"
    )


async def soak(args: argparse.Namespace) -> int:
    # A SIGTERM (an impatient caller, a timeout) ends the run as Ctrl-C does: the nats-server and the daemon it
    # started are stopped on the way out, not left behind.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    prefix = f"soak{os.getpid()}"
    with tempfile.TemporaryDirectory() as store:
        server = NatsServer(store_dir=Path(store) / "nats")
        await asyncio.to_thread(server.start)
        try:
            start = daemon_here(args, server.url, prefix) if args.tracemalloc else None
            if args.tracemalloc:
                tracemalloc.start(args.frames)
            async with start or daemon_process(args, server.url, prefix, Path(store) / "logs") as pid:
                return await _load(args, server.url, prefix, pid, server.pid)
        finally:
            await asyncio.to_thread(server.stop)


async def _load(args: argparse.Namespace, url: str, prefix: str, pid: int, server_pid: int | None) -> int:
    nc = await nats.connect(url)
    client = RebaserClient(nc, prefix=prefix)
    pool = [(WorkspacePk.new(), ChangeSetId.new()) for _ in range(args.change_sets)]
    sent = errors = 0
    stop = time.monotonic() + args.minutes * 60
    rng = random.Random(1)

    async def caller() -> None:
        nonlocal sent, errors
        while time.monotonic() < stop:
            wk, cs = pool[rng.randrange(len(pool))]
            try:
                reply = await client.enqueue_updates_with_reply(
                    wk, cs, [SetLiteral(path=f"/k{sent % 5}", value=sent)], timeout=30
                )
                if not reply.ok:
                    errors += 1
            except Exception:
                errors += 1
            sent += 1

    callers = [asyncio.create_task(caller()) for _ in range(args.clients)]
    began = time.monotonic()
    warm: list[tuple[float, float]] = []
    warm_server: list[tuple[float, float]] = []
    drawn: list[tuple[float, float, float | None]] = []  # (minute, daemon MB, nats-server MB) for --png
    since: tracemalloc.Snapshot | None = None
    counted: collections.Counter[str] | None = None
    try:
        while time.monotonic() < stop:
            await asyncio.sleep(min(args.sample, max(0.0, stop - time.monotonic())))
            minute = (time.monotonic() - began) / 60
            mb = rss_mb(pid)
            server = rss_mb(server_pid) if server_pid is not None else None
            server_mb = f"  nats-server {server:7.1f} MB" if server is not None else ""
            drawn.append((minute, mb, server))
            print(
                f"{minute:6.1f} min  rss {mb:7.1f} MB{server_mb}  requests {sent:>9}  errors {errors}"
                f"{await held_by_jetstream(nc)}",
                flush=True,
            )
            if minute >= args.warmup:
                warm.append((minute, mb))
                if server is not None:
                    warm_server.append((minute, server))
                if args.tracemalloc:
                    if since is None or counted is None:
                        since, counted = daemon_snapshot(), object_counts()
                    else:
                        print("\n".join(growth(since, frames=args.frames)), flush=True)
                        print("\n".join(counts_grown(counted)), flush=True)
    finally:
        for task in callers:  # done by now at the end of the run; on a SIGTERM, stopped here
            task.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        await client.close()
        await nc.close()
    if warm_server:  # (before the daemon's verdict, which stays the last line)
        print(
            f"nats-server after the warm-up: rss {warm_server[0][1]:.1f} -> {warm_server[-1][1]:.1f} MB, "
            f"slope {slope(warm_server):+.3f} MB/min",
            flush=True,
        )
    if warm:
        low, high = min(mb for _, mb in warm), max(mb for _, mb in warm)
        print(
            f"after {args.warmup:g} min of warm-up: rss {warm[0][1]:.1f} -> {warm[-1][1]:.1f} MB, spread "
            f"{high - low:.1f} MB, slope {slope(warm):+.3f} MB/min; {sent} requests, {errors} errors "
            f"(lease_mode {args.lease_mode})",
            flush=True,
        )
    if args.png is not None and drawn:
        title = (
            f"{args.change_sets:,} change sets, {args.clients} callers, lease_mode {args.lease_mode}: "
            f"{sent:,} requests, {errors} errors"
        )
        draw(drawn, args.warmup, title, args.png)
        print(f"drawn: {args.png}", flush=True)
    return 1 if errors else 0


def draw(samples: list[tuple[float, float, float | None]], warmup: float, title: str, path: Path) -> None:
    """The daemon's and nats-server's RSS over the run, the warm-up shaded, as a PNG (matplotlib: the ``bench``
    extra, which ``make soak`` installs)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(9, 4.5), dpi=100)
    minutes = [m for m, _, _ in samples]
    axes.plot(minutes, [d for _, d, _ in samples], label="daemon RSS", color="tab:blue", marker=".")
    server = [(m, s) for m, _, s in samples if s is not None]
    if server:
        axes.plot(*zip(*server, strict=True), label="nats-server RSS", color="tab:orange", marker=".")
    axes.axvspan(0, warmup, color="0.9", label=f"warm-up ({warmup:g} min, left out of the slope)")
    axes.set_xlabel("minutes")
    axes.set_ylabel("MB")
    axes.set_ylim(bottom=0)
    axes.set_xlim(left=0)
    axes.grid(True, color="0.85")
    axes.legend(loc="lower right")
    axes.set_title(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    pyplot.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=5.0, help="minutes left out of the verdict")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--change-sets", type=int, default=5000)
    parser.add_argument("--sample", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--lease-mode", choices=("task", "daemon"), default="task")
    parser.add_argument("--tracemalloc", action="store_true", help="run the daemon here, print what grows")
    parser.add_argument(
        "--app", default=APP, help="the daemon's app, module:attribute (without --tracemalloc)"
    )
    parser.add_argument("--frames", type=int, default=1, help="with --tracemalloc: call stacks this deep")
    parser.add_argument(
        "--png",
        type=Path,
        help="draw both RSS over the run into this PNG (needs the bench extra: matplotlib)",
    )
    args = parser.parse_args()
    if args.png is not None and importlib.util.find_spec("matplotlib") is None:
        parser.error("--png needs matplotlib: pip install -e '.[bench]' (make soak installs it)")
    try:
        sys.exit(asyncio.run(soak(args)))
    except asyncio.CancelledError:  # SIGTERM (see soak): everything it started is stopped by now
        print("stopped by SIGTERM", file=sys.stderr)
        sys.exit(143)


if __name__ == "__main__":
    main()
