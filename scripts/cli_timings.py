"""How long the command-line tools take, end to end, as a user runs them.

    python scripts/cli_timings.py [--runs N]

Each command runs ``N`` times (default 7), each time in a fresh interpreter (the console scripts next to this
Python, ``rebaser`` and ``rebaser-server``), and the script prints the median and the fastest wall time per
command. The commands that talk to NATS run against a nats-server this script starts (127.0.0.1, a free port, a
temporary store) with a deployment's streams created, as a daemon leaves them; it stops that server (by its PID
if it does not stop on its own) before it exits. Also timed: importing ``rebaser_client.admin.cli.main`` alone.

The targets (issue 35): ``--version`` and ``--help`` under 0.3 s, a command that talks to NATS under 0.5 s. Figures
move by 10-20 % from run to run on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from rebaser_core.embedded import NatsServer

_BIN = Path(sys.executable).parent
_TARGET_LOCAL = 0.3  # seconds: --version, --help
_TARGET_NATS = 0.5  # seconds: a command that talks to NATS


def _script(name: str) -> list[str]:
    """The console script as installed, or the same entry point through this interpreter."""
    path = _BIN / name
    if path.exists():
        return [str(path)]
    module = {"rebaser": "rebaser_client.admin.cli.main", "rebaser-server": "rebaser_server.cli.main"}[name]
    return [sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())"]


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, str | None]:
    """Wall seconds, and what went wrong (None if the command succeeded)."""
    start = time.perf_counter()
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode == 0:
        return elapsed, None
    return elapsed, f"exit {proc.returncode}: {proc.stderr.decode(errors='replace').strip()[-2000:]}"


async def _create_streams(url: str) -> None:
    """The streams and the shard layout a daemon creates at its start (all the admin commands need to read)."""
    import nats

    from rebaser_core.nats.layout_store import init_layout
    from rebaser_core.nats.streams import ensure_streams
    from rebaser_core.settings import Settings

    nc = await nats.connect(url, connect_timeout=5)
    try:
        js = nc.jetstream(timeout=5)
        settings = Settings()
        await ensure_streams(js, settings)
        await init_layout(js, settings.subjects, streams=1, mode=None, who="cli_timings")
    finally:
        await nc.drain()


def _stop(server: NatsServer, pid: int | None) -> None:
    try:
        server.stop()
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 0)  # still there: stop() did not end it
                os.kill(pid, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7, help="fresh interpreters per command (default 7)")
    args = parser.parse_args()

    env = {k: v for k, v in os.environ.items() if not k.startswith("REBASER_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    rebaser, server_cli = _script("rebaser"), _script("rebaser-server")
    local: list[tuple[str, list[str]]] = [
        ("python -c pass (the interpreter alone)", [sys.executable, "-c", "pass"]),
        (
            "import rebaser_client.admin.cli.main",
            [sys.executable, "-c", "import rebaser_client.admin.cli.main"],
        ),
        ("rebaser --version", [*rebaser, "--version"]),
        ("rebaser --help", [*rebaser, "--help"]),
        ("rebaser dlq --help", [*rebaser, "dlq", "--help"]),
        ("rebaser new-id", [*rebaser, "new-id"]),
        ("rebaser-server --version", [*server_cli, "--version"]),
        ("rebaser-server --help", [*server_cli, "--help"]),
    ]

    server = NatsServer()
    pid: int | None = None
    rows: list[tuple[str, float, float, float, bool]] = []
    try:
        server.start()
        pid = server.pid
        asyncio.run(_create_streams(server.url))
        remote: list[tuple[str, list[str]]] = [
            ("rebaser dlq list (NATS)", [*rebaser, "dlq", "list", "--nats-url", server.url]),
            ("rebaser status (NATS)", [*rebaser, "status", "--nats-url", server.url]),
            ("rebaser streams show (NATS)", [*rebaser, "streams", "show", "--nats-url", server.url]),
        ]
        for name, argv in [*local, *remote]:
            target = _TARGET_NATS if (name, argv) in remote else _TARGET_LOCAL
            # Once first, untimed: the page cache and .pyc files warm, as for any run but a machine's first.
            _time(argv, env)
            times: list[float] = []
            failures: list[str] = []
            for _ in range(args.runs):
                elapsed, failure = _time(argv, env)
                times.append(elapsed)
                failures += [failure] if failure else []
            if failures:
                sys.stderr.write(f"{name}: {len(failures)} of {args.runs} runs failed, e.g. {failures[0]}\n")
            rows.append((name, statistics.median(times), min(times), target, bool(failures)))
    finally:
        _stop(server, pid)

    width = max(len(r[0]) for r in rows)
    print(f"{'command':<{width}}  median    min   target  ({args.runs} runs each, fresh interpreter)")
    for name, median, fastest, target, failed in rows:
        verdict = "FAILED" if failed else ("ok" if median < target else "SLOW")
        if name.startswith(("python -c", "import ")):
            verdict, shown = "", "     "
        else:
            shown = f"{target:.1f} s"
        print(f"{name:<{width}}  {median:5.3f}  {fastest:5.3f}  {shown}  {verdict}")
    return 1 if any(r[4] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
