"""Where the suite's time goes, by folder: the tests' own durations (set-up, call and tear-down) summed per folder,
from a JUnit XML report, with the slowest tests of each.

    .venv/bin/pytest -m "not slow" -q -n 8 --dist worksteal --junitxml=/tmp/suite.xml
    python scripts/suite_time.py /tmp/suite.xml [--depth 3] [--top 3]

The sums are worker-seconds: with 8 workers on two cores they add up to several times the run's wall time, and a
test that computes is slowed by every other one that does. They show where to look, not what a test costs alone.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def folder_of(classname: str, depth: int) -> str:
    """``tests.integration.changeset.test_fence`` -> ``tests/integration/changeset`` (at depth 3)."""
    parts = classname.split(".")
    module_end = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts))
    return "/".join(parts[: min(depth, module_end)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("report", type=Path, help="a JUnit XML report (pytest --junitxml)")
    parser.add_argument(
        "--depth", type=int, default=3, help="folder depth to sum at (tests/integration/X: 3)"
    )
    parser.add_argument("--top", type=int, default=2, help="the slowest tests shown per folder")
    args = parser.parse_args(argv)
    cases = ET.parse(args.report).getroot().iter("testcase")
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    slowest: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for case in cases:
        if case.find("skipped") is not None:
            continue
        folder = folder_of(case.get("classname", ""), args.depth)
        took = float(case.get("time", "0"))
        seconds[folder] += took
        counts[folder] += 1
        slowest[folder].append((took, case.get("name", "")))
    total = sum(seconds.values())
    print(f"{'folder':40} {'tests':>6} {'seconds':>9} {'share':>6}  slowest")
    for folder in sorted(seconds, key=lambda f: -seconds[f]):
        top = sorted(slowest[folder], reverse=True)[: args.top]
        shown = ", ".join(f"{name} {took:.0f} s" for took, name in top)
        share = 100 * seconds[folder] / total if total else 0.0
        print(f"{folder:40} {counts[folder]:6} {seconds[folder]:9.1f} {share:5.1f}%  {shown}")
    print(f"{'total':40} {sum(counts.values()):6} {total:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
