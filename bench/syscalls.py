"""Counting nats-server's disk syscalls while a scenario runs: what a request costs the disk.

``strace -f -c`` attached to the server (all its threads) counts ``fsync``/``fdatasync`` (each one waits for the
disk) and ``pwrite64`` (each stored record: a message, a tombstone, a purge marker). It slows the server down, so a
run that counts (``bench.py --count-syscalls``) is for the counts, not for its throughput. Needs ``strace``
(Debian: ``apt-get install strace``) and the right to trace the server (root, or ptrace_scope 0).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["SyscallCounter"]

_SYSCALLS = ("fsync", "fdatasync", "pwrite64")


class SyscallCounter:
    """``with SyscallCounter(pid) as counter: ...``; then ``counter.counts`` (syscall -> calls)."""

    def __init__(self, pid: int) -> None:
        strace = shutil.which("strace")
        if strace is None:
            raise RuntimeError("--count-syscalls needs strace (Debian: apt-get install strace)")
        self._strace = strace
        self._pid = pid
        self._dir = Path(tempfile.mkdtemp(prefix="rebaser-strace-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self.counts: dict[str, int] = {}

    def __enter__(self) -> Self:
        out = self._dir / "summary"
        err = self._dir / "stderr"
        with err.open("wb") as stderr:
            self._proc = subprocess.Popen(
                [
                    self._strace,
                    "-f",
                    "-c",
                    "-e",
                    f"trace={','.join(_SYSCALLS)}",
                    "-o",
                    str(out),
                    "-p",
                    str(self._pid),
                ],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        # strace says "Process N attached" for each thread once it traces it; counting starts after the first.
        deadline = time.monotonic() + 10
        while b"attached" not in err.read_bytes():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"strace did not attach to pid {self._pid}: {err.read_text()}")
            time.sleep(0.01)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.send_signal(signal.SIGINT)  # strace detaches and writes its summary
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        summary = self._dir / "summary"
        # In place: a caller may hold the dict from before the run ended.
        self.counts.update(parse_summary(summary.read_text() if summary.exists() else ""))
        shutil.rmtree(self._dir, ignore_errors=True)


def parse_summary(text: str) -> dict[str, int]:
    """syscall -> calls, from ``strace -c``'s table (``% time seconds usecs/call calls [errors] syscall``)."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[-1] in _SYSCALLS and fields[3].isdigit():
            counts[fields[-1]] = int(fields[3])
    return counts
