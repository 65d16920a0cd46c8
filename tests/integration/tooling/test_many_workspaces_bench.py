"""``python -m bench.many_workspaces --smoke``: the one-workspace and many-workspaces scenarios, each on a fresh
3-node cluster with one daemon, run and are reported, without an error.

A few dozen requests, so it finishes in well under a minute; no figure is asserted (timing belongs in the benchmark
itself, on a machine of its own), only that both scenarios are in the table and nothing failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.bench_smoke  # make check-bench (in CI), not make test: see test_bench_smoke.py


@pytest.mark.timeout(330)  # about 45 s alone, more beside the rest of the suite on two cores
def test_many_workspaces_smoke_reports_both_scenarios_without_errors(tmp_path: Path) -> None:
    results, markdown = tmp_path / "results.json", tmp_path / "table.md"
    args = ["--smoke", "--json", str(results), "--markdown", str(markdown)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.many_workspaces", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard, not a timing
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = markdown.read_text()
    header = "| | one workspace | 20 workspaces | ratio |"
    assert header in table and header in proc.stdout, (
        table
    )  # printed, and written with the command that made it
    assert "python -m bench.many_workspaces --smoke" in table, table
    assert "| errors | 0 | 0 | - |" in table, table
    for row in (
        "| throughput (req/s) |",
        "| p50 / p99 latency (ms) |",
        "| NATS CPU s during the run (3 nodes) |",
        "| daemon CPU s during the run (1 daemons) |",
        "| durable consumers on the tasks stream after the run |",
        "| NATS memory after the run (MB, 3 nodes) |",
        "| NATS CPU % of a core in 1 s of quiet after |",
    ):
        assert row in table, f"missing row {row!r} in:\n{table}"
    runs = json.loads(results.read_text())["results"]
    assert [(r["scenario"], r["workspaces"]) for r in runs] == [("one", 1), ("many", 20)]
    for run in runs:
        assert run["errors"] == 0 and run["ok"] == run["requests"] == 20, run
