"""Deterministic profiles of a benchmark's daemons or workers (``bench/bench.py --cprofile DIR``).

py-spy samples what runs, and on a machine the benchmark keeps busy much of what it sees is a process waiting for a
core inside a system call. cProfile counts instead: every call of every Python function, so the figures divide by
the requests served (calls per request, time per call). Its own overhead inflates small functions, so read the
counts and the order, not the absolute times; and a coroutine counts one call each time it resumes.

- ``python -m bench.cprof DIR PYTHON -m MODULE ARGS...`` (what ``--cprofile`` puts before each daemon's command)
  runs ``MODULE`` as ``__main__`` under cProfile and writes ``DIR/MODULE.PID.prof`` when the process exits,
  SIGTERM included;
- ``python -m bench.cprof --show FILE [--per N] [--top K]`` prints the ``K`` functions with the most time of their
  own, and the ``K`` of the project's (``rebaser_*``) with the most time including what they call; with ``--per
  N`` each call count is also divided by ``N`` (the requests served).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import runpy
import signal
import sys
from pathlib import Path
from types import FrameType

__all__ = ["main"]


def _run(out_dir: Path, command: list[str]) -> int:
    if len(command) < 3 or command[1] != "-m":
        print("usage: python -m bench.cprof DIR PYTHON -m MODULE ARGS...", file=sys.stderr)
        return 2
    module, args = command[2], command[3:]
    path = out_dir / f"{module}.{os.getpid()}.prof"

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    # Replaced by the module's own handler if it installs one (the daemon does, and exits cleanly on SIGTERM).
    signal.signal(signal.SIGTERM, stop)
    sys.argv = [module, *args]
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        with contextlib.suppress(SystemExit, KeyboardInterrupt):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        profiler.disable()
        profiler.dump_stats(path)
    return 0


def _show(path: Path, per: float | None, top: int) -> None:
    stats = pstats.Stats(str(path))
    entries = stats.stats  # type: ignore[attr-defined]  # {(file, line, name): (primitive, calls, own, total, _)}
    total = max((t for _, _, _, t, _ in entries.values()), default=0.0)
    print(f"{path}: {total:.2f} s in the profiled program")

    def rows(keys: list[tuple[str, int, str]]) -> None:
        print(f"  {'calls':>9} {'per req':>8} {'own s':>7} {'incl. s':>8}  function")
        for key in keys:
            # (primitive calls, all calls, ...): the recursive ones count too.
            _, calls, own, incl, _ = entries[key]
            ratio = f"{calls / per:8.2f}" if per else f"{'':>8}"
            file, line, name = key
            where = f"{Path(file).name}:{line}({name})" if line else name
            print(f"  {calls:9d} {ratio} {own:7.3f} {incl:8.3f}  {where}")

    print(f"\nmost time of their own (top {top}):")
    rows(sorted(entries, key=lambda k: entries[k][2], reverse=True)[:top])
    ours = [k for k in entries if "/rebaser_" in k[0]]
    print(f"\nthe project's functions, most time including what they call (top {top}):")
    rows(sorted(ours, key=lambda k: entries[k][3], reverse=True)[:top])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--show":
        parser = argparse.ArgumentParser(prog="python -m bench.cprof --show")
        parser.add_argument("file", type=Path)
        parser.add_argument("--per", type=float, default=None, help="divide call counts by this (requests)")
        parser.add_argument("--top", type=int, default=30)
        args = parser.parse_args(sys.argv[2:])
        _show(args.file, args.per, args.top)
        return 0
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    return _run(Path(sys.argv[1]), sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
