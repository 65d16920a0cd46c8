"""Garbage-collector statistics of a benchmark's daemons (``bench/bench.py --gc-stats``).

``bench.py --gc-stats`` puts this directory first on the daemons' ``PYTHONPATH``, so Python imports this module at
start-up in each of them. It times every collection with ``gc.callbacks`` and, when the process exits, appends one
JSON line to ``$BENCH_GC_STATS``: per generation the collections, their total and longest time, and the process's
peak resident memory. Without that variable it does nothing.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import resource
import sys
import time
from typing import Any

_PATH = os.environ.get("BENCH_GC_STATS")


def _install(path: str) -> None:
    runs, seconds, longest = [0, 0, 0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    started = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        took, generation = time.perf_counter() - started[0], info["generation"]
        runs[generation] += 1
        seconds[generation] += took
        longest[generation] = max(longest[generation], took)

    def report() -> None:
        line = {
            "pid": os.getpid(),
            "argv": sys.argv,
            "threshold": gc.get_threshold(),
            "frozen": gc.get_freeze_count(),
            "runs": runs,
            "seconds": [round(s, 3) for s in seconds],
            "longest_ms": [round(s * 1000, 1) for s in longest],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        }
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")

    gc.callbacks.append(timed)
    atexit.register(report)


if _PATH:
    _install(_PATH)
