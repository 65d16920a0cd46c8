"""The benchmark's subprocesses (daemons, baseline workers) and CPU accounting from /proc."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the benchmark dies (Linux), so nothing outlives a killed run."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_kb(pid: int) -> int:
    """Resident memory of ``pid`` (kB; 0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def machine_busy_seconds() -> float:
    """CPU seconds all processes on this machine spent busy so far (from /proc/stat; 0 if unavailable)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


class Processes:
    """Every subprocess the benchmark starts; all are stopped by PID on exit, also on Ctrl-C or error."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[int, tuple[subprocess.Popen[bytes], Path]] = {}

    def spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                args,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches only us; we stop the children in order
                preexec_fn=_die_with_parent,
            )
        self.procs[proc.pid] = (proc, log)
        return proc

    def log_of(self, proc: subprocess.Popen[bytes]) -> str:
        return self.procs[proc.pid][1].read_text(errors="replace")

    async def wait_ready(self, proc: subprocess.Popen[bytes], marker: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.log_of(proc):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(self.log_of(proc).splitlines()[-20:])
                raise RuntimeError(f"process {proc.pid} {proc.args!r} did not become ready:\n{tail}")
            await asyncio.sleep(0.05)

    async def stop(self, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            for _ in range(int(timeout / 0.05)):
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                print(f"  pid {proc.pid} ignored SIGTERM for {timeout}s: killing it", file=sys.stderr)
                proc.kill()
        proc.wait()
        self.procs.pop(proc.pid, None)

    def stop_all(self) -> None:
        for proc, _ in list(self.procs.values()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for pid, (proc, _) in list(self.procs.items()):
            try:
                proc.wait(timeout=15.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self.procs.pop(pid, None)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()
