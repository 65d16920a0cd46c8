"""``make bench`` in miniature: the benchmark runs every kind of scenario and writes its ratios page; the
instruction count (``bench/instructions.py``), the soak (``bench/soak.py``), the progress-ack probe
(``bench/progress_ack_probe.py``) and the server's price per operation (``bench/server_ops.py``) run and report.

Tiny loads (a few dozen requests), so it finishes in seconds; no figure is asserted (timing belongs in the
benchmark itself, on a machine of its own), only that every row of the page is there and nothing failed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# Tooling, not the product: `make check-bench` runs these (CI does, after `make test`), so that `make test` stays a
# developer's loop (they cost about 45 s of CPU on two cores).
pytestmark = pytest.mark.bench_smoke

ROWS = (
    "no-op app throughput ÷ fair loop",
    "built-in app throughput ÷ fair loop",
    "fair loop throughput ÷ plain loop (reference)",
    "no-op app throughput ÷ plain loop (reference)",
    "daemon CPU per request ÷ fair loop's",
    "client CPU per request ÷ fair loop's",
    "throughput ratio the CPU per request allows",
    "no-op app cold p99 ÷ fair loop's cold p99",
    "burst (20 change sets x 1): drain time ÷ fair loop's",
    "idle: nats-server CPU per owned idle change set ÷ fair loop's",
    "idle: daemon CPU per owned idle change set ÷ fair loop's",
    "idle: the next request once let go ÷ still held",
    "event feed on ÷ off",
    "2 daemons ÷ 1 daemon (throughput)",
    "DVU burst (20 requests on one change set), natural DVU cost",
    "DVU burst (20 requests on one change set), 10x DVU cost",
)


# Every implementation, both daemon counts and every kind of scenario: about 80 s and 40 s of CPU (20 scenarios,
# each starting its own processes), so it runs with the slow tests (`make chaos`); the smoke below runs in CI.
@pytest.mark.slow
@pytest.mark.timeout(330)  # about 80 s alone, more beside the rest of the suite on two cores
def test_bench_writes_the_ratios_page(tmp_path: Path) -> None:
    doc = _page(tmp_path)
    args = ["--per-change-set", "4", "--change-sets", "10", "--daemons", "1,2", "--burst", "20"]
    args += ["--dvu-requests", "20", "--quiescent", "0.5", "--clients", "8", "--doc", str(doc)]
    args += ["--idle", "20", "--idle-window", "0.5"]
    _run("bench.py", args, timeout=300)  # about 80 s here; a hang guard, not a timing
    page = doc.read_text()
    _check_page(page, ROWS)
    assert "not measured" not in page
    assert "python bench/bench.py --per-change-set 4" in page  # the command that produced it


# The rows the smoke run below fills: the project's own implementations, one daemon.
SMOKE_ROWS = (
    "built-in app cold p99 ÷ its own warm p99",
    "no-op app cold p99 ÷ its own warm p99",
    "DVU burst (4 requests on one change set), natural DVU cost",
    "DVU burst (4 requests on one change set), 10x DVU cost",
)


@pytest.mark.timeout(330)
def test_bench_smoke_runs_every_kind_of_scenario_and_writes_the_page(tmp_path: Path) -> None:
    # Throughput, burst, idle and DVU bursts, for rebaser and the snapshot app on one daemon: every code path of the
    # bench and its page, in a quarter of the full run's CPU.
    doc = _page(tmp_path)
    args = ["--impl", "rebaser,snapshots", "--per-change-set", "2", "--change-sets", "2", "--daemons", "1"]
    args += ["--burst", "4", "--dvu-requests", "4", "--quiescent", "0.3", "--clients", "2", "--doc", str(doc)]
    args += ["--idle", "3", "--idle-window", "0.3"]
    out = _run("bench.py", args, timeout=300).stdout  # a hang guard, not a timing
    _check_page(doc.read_text(), SMOKE_ROWS)
    assert "burst rebaser: 4 change sets drained" in out, out
    assert "idle rebaser: 3 of 3 change sets held" in out, out
    assert "python bench/bench.py --impl rebaser,snapshots" in doc.read_text()  # the command that produced it


def _page(tmp_path: Path) -> Path:
    """A page with hand-written text around an old generated section."""
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(
        "# Benchmarks\n\nkept above\n\n<!-- bench:begin (old) -->\n<!-- bench:end -->\n\nkept below\n"
    )
    doc.write_text(doc.read_text().replace("<!-- bench:begin (old) -->", _begin_marker()))
    return doc


def _check_page(page: str, rows: tuple[str, ...]) -> None:
    assert "kept above" in page and "kept below" in page  # hand-written notes survive a rewrite
    for row in rows:
        assert f"| {row}" in page, f"missing row {row!r} in:\n{page}"
    assert "WRONG" not in page  # the DVU burst's final state is the serial one


@pytest.mark.timeout(330)
def test_bench_profiles_its_daemons_and_shows_the_profile(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    args = ["--impl", "rebaser", "--daemons", "1", "--change-sets", "2", "--per-change-set", "3"]
    args += ["--burst", "0", "--dvu-requests", "0", "--idle", "0", "--clients", "2", "--quiescent", "0.5"]
    _run("bench.py", [*args, "--cprofile", str(profiles)], timeout=300)
    (profile,) = profiles.glob("rebaser_server.*.prof")  # written when the daemon stopped (SIGTERM)
    shown = _run("cprof.py", ["--show", str(profile), "--per", "6", "--top", "50"], timeout=60).stdout
    assert "most time of their own" in shown
    assert "processor.py" in shown and "_on_request" in shown, shown  # the project's request path is in it


def _begin_marker() -> str:
    sys.path.insert(0, str(ROOT))
    try:
        from bench.report import BEGIN
    finally:
        sys.path.remove(str(ROOT))
    return BEGIN


@pytest.mark.skipif(shutil.which("callgrind_control") is None, reason="needs valgrind (callgrind_control)")
# The client side is the same tool on the other process: with the slow tests (valgrind costs 10 s of CPU a side).
@pytest.mark.parametrize("side", ["worker", pytest.param("client", marks=pytest.mark.slow)])
def test_instruction_count_runs_and_reports_per_request(side: str) -> None:
    # A handful of requests under valgrind: that it counts and reports, not what it counts.
    args = ["--impl", "rebaser", "--requests", "20", "--change-sets", "2", "--clients", "2", "--idle", "0.5"]
    args += ["--side", side]
    proc = _run("instructions.py", args, timeout=300)
    report = proc.stdout.splitlines()[-1]
    assert report.strip().startswith("rebaser:") and "M instructions per request" in report, proc.stdout


def _run(script: str, args: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``bench/<script>`` with ``args``; it must succeed."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_soak_runs_and_reports_both_memories_and_the_slope() -> None:
    # make soak in miniature (bench/soak.py): a few seconds of load on a daemon at the defaults; that it samples the
    # daemon's and nats-server's RSS and reports the slope after the warm-up, not what they are.
    args = ["--minutes", "0.15", "--warmup", "0.05", "--sample", "2", "--clients", "2", "--change-sets", "20"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.soak", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    samples = [line for line in proc.stdout.splitlines() if " min  rss " in line]
    assert samples and all("nats-server" in line for line in samples), proc.stdout
    verdict = proc.stdout.splitlines()[-1]
    assert "MB/min" in verdict and ", 0 errors" in verdict, proc.stdout


def test_the_soak_with_tracemalloc_says_where_the_memory_goes_by_part_of_the_code() -> None:
    # bench/soak.py --tracemalloc: the daemon in the script's process; each sample after the warm-up gives what its
    # code holds by the part that allocated it (a sub-package, a library, a standard module) and what grew.
    args = ["--tracemalloc", "--minutes", "0.2", "--warmup", "0.05", "--sample", "3", "--clients", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.soak", *args, "--change-sets", "20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    held = [line for line in proc.stdout.splitlines() if line.strip().startswith("traced ")]
    assert held and "rebaser_server.changeset" in held[-1] and "asyncio" in held[-1], proc.stdout


def test_the_soak_picture_without_matplotlib_says_how_to_get_it(tmp_path: Path) -> None:
    # Run as where the bench extra is not installed (make check-bench installs it): matplotlib cannot be found.
    without = "import runpy, sys; sys.modules['matplotlib'] = None; runpy.run_module('bench.soak', run_name='__main__')"
    proc = subprocess.run(
        [sys.executable, "-c", without, "--minutes", "0.1", "--png", str(tmp_path / "soak.png")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "pip install -e '.[bench]'" in proc.stderr, proc.stderr
    assert not (tmp_path / "soak.png").exists()


def test_the_soak_draws_both_memories_over_time(tmp_path: Path) -> None:
    # bench/soak.py --png: the daemon's line, nats-server's, the warm-up shaded; a PNG an image library reads back.
    image_module = pytest.importorskip("PIL.Image", reason="needs the bench extra (make check-bench)")
    sys.path.insert(0, str(ROOT))
    try:
        from bench.soak import draw
    finally:
        sys.path.remove(str(ROOT))
    samples = [(m / 2, 100.0 + m, 150.0 + 2 * m) for m in range(1, 41)]
    path = tmp_path / "pictures" / "soak.png"
    draw(samples, 5.0, "20 change sets, 2 callers, lease_mode task: 4,000 requests, 0 errors", path)
    with image_module.open(path) as image:
        assert image.format == "PNG" and image.size == (900, 450)
        colours = {colour for _, colour in image.convert("RGB").getcolors(maxcolors=1 << 20) or []}
    assert (31, 119, 180) in colours and (
        255,
        127,
        14,
    ) in colours  # tab:blue (daemon), tab:orange (nats-server)
    assert (229, 229, 229) in colours  # the warm-up, shaded 0.9 grey


def test_progress_ack_probe_runs_and_reports_both_ways() -> None:
    # One trial each way on a 3-node cluster: that it runs and reports, not what the server did.
    proc = _run("progress_ack_probe.py", ["--trials", "1"], timeout=120)
    assert "step-down at once:" in proc.stdout and "step-down after:" in proc.stdout, proc.stdout


def test_server_ops_prices_every_operation_and_every_way_of_removal() -> None:
    # A few of each, with a few idle consumers: that every operation runs and is reported, not what it costs.
    proc = _run("server_ops.py", ["--count", "24", "--removal", "3"], timeout=120)
    for operation in (
        "record read, DIRECT.GET",
        "compare-and-set publish, acked",
        "record rewrite, no header",
        "record rewrite, 3 KiB window",
        "lease renewal (+WPI, confirmed)",
        "3 idle consumers on the stream",
        "delete by sequence, a message",
        "filtered purge of 16 messages (per purge)",
        "ordered consumer deleted (CONSUMER.DELETE)",
        "ordered consumer unsubscribed and reaped (1 s threshold)",
    ):
        assert operation in proc.stdout, proc.stdout


@pytest.mark.parametrize("case", ["applied", "refused", "retry"])
def test_request_path_follows_a_request_through_the_change_set_package(case: str) -> None:
    modules = "processor,handling,decisions,postprocess,group,replies,trimmer"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "request_path.py"),
            "--case",
            case,
            "--modules",
            modules,
            "--show",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summaries = [line for line in result.stdout.splitlines() if line.startswith("delivery ")]
    assert len(summaries) == (2 if case == "retry" else 1), result.stdout
    # The decision comes before anything is carried out, and the group is carried out after it.
    lines = result.stdout.splitlines()

    def first(file: str, function: str) -> int:
        # A line is one file's consecutive stops ("changeset/handling.py: decide, _refused, ..."); which stop comes
        # first on it may vary with timing, so a function is looked for anywhere in its file's line.
        found = [
            i for i, line in enumerate(lines) if f"{file}:" in line and function in line.split(":", 1)[1]
        ]
        assert found, f"{file}: {function} not shown in\n{result.stdout}"
        return found[0]

    assert first("handling.py", "decide") < first("postprocess.py", "carry_out") < first("group.py", "flush")
