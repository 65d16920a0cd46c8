"""``make run``'s demo: its summary counts what happened to its own requests, the same on a rerun over the same store,
and it says nothing that is not so (no "Ctrl-C to stop" for a run that ends by itself, the health line once; a
conflict is called a conflict, not a refusal, which is another outcome)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.daemons import run_daemon

_SUMMARY = re.compile(
    r"summary: (\d+) requests: (\d+) applied, (\d+) with conflicts \(nothing of them applied\), (\d+) errors"
)


async def test_demo_summary_is_exact_and_stable_across_runs(tmp_path: Path) -> None:
    args = ("--demo", "--data-dir", str(tmp_path / "data"), "--port", "0", "--http-port", "0")
    summaries = []
    for run in range(2):  # the second run finds the first one's store
        code, output = await run_daemon(
            (*args, "--quiescent-period", "2"), tmp_path, f"demo{run}", timeout=120
        )
        assert code == 0, output
        assert "Ctrl-C" not in output, output
        assert output.count("health endpoint on") == 1, output
        found = _SUMMARY.search(output)
        assert found is not None, output
        assert "refused" not in output, output  # no request of the demo is refused (RefusedError)
        replies, applied, conflicts, errors = map(int, found.groups())
        assert replies == applied + conflicts + errors, output
        # 3 features x 40 batches, every 9th one stale (4 each), plus HEAD's set-up and two applications onto HEAD,
        # the second of which conflicts.
        assert (replies, applied, conflicts, errors) == (123, 110, 13, 0), output
        summaries.append(found.groups())
    assert summaries[0] == summaries[1]
