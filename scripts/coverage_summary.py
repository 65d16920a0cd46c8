"""Line and branch coverage per package, and the least-covered modules: a map for the next tests, not a target.

``make test`` runs it after the suite (which measures with ``--cov``, subprocesses included: pyproject.toml's
``[tool.coverage.run]``). Run it by hand after ``pytest --cov``:

    python scripts/coverage_summary.py [--least N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_of(path: str) -> str:
    """``rebaser_server/changeset/trimmer.py`` -> ``rebaser_server.changeset``; top-level modules count to their
    package (``rebaser_core/errors.py`` -> ``rebaser_core``)."""
    parts = Path(path).parts
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


def percent(covered: int, total: int) -> str:
    return f"{100.0 * covered / total:5.1f}%" if total else "    -"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--least", type=int, default=12, help="how many least-covered modules to list")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "coverage.json"
        done = subprocess.run(
            [sys.executable, "-m", "coverage", "json", "-q", "-o", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(f"no coverage data: {done.stderr.strip() or done.stdout.strip()}", file=sys.stderr)
            return 1
        files = json.loads(out.read_text())["files"]
    packages: dict[str, list[int]] = {}
    modules = []
    for path, data in files.items():
        s = data["summary"]
        figures = [s["covered_lines"], s["num_statements"], s["covered_branches"], s["num_branches"]]
        total = packages.setdefault(package_of(path), [0, 0, 0, 0])
        for i, value in enumerate(figures):
            total[i] += value
        modules.append((s["num_statements"] - s["covered_lines"], path, figures))
    print(f"{'package':28} {'lines':>14} {'':>6} {'branches':>14} {'':>6}")
    for name in sorted(packages):
        lines, statements, branches, all_branches = packages[name]
        print(
            f"{name:28} {lines:>6} of {statements:<5} {percent(lines, statements)} "
            f"{branches:>6} of {all_branches:<5} {percent(branches, all_branches)}"
        )
    every = [sum(p[i] for p in packages.values()) for i in range(4)]
    print(
        f"{'all':28} {every[0]:>6} of {every[1]:<5} {percent(every[0], every[1])} "
        f"{every[2]:>6} of {every[3]:<5} {percent(every[2], every[3])}"
    )
    print("\nleast covered (most lines not run):")
    for missing, path, (lines, statements, branches, all_branches) in sorted(modules, reverse=True)[
        : args.least
    ]:
        print(
            f"  {path:50} {missing:>4} lines not run  lines {percent(lines, statements)}  "
            f"branches {percent(branches, all_branches)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
