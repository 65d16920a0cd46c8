"""One nats-server per store directory, ever.

Two nats-servers on one JetStream store corrupt it (both recover and write the same files; a daemon on such a store
can stop answering for 90 s while its readiness probe still says ready). :class:`StoreGuard` prevents that:

- an exclusive ``flock`` on ``<store>/rebaser.lock``, held by the process that owns the server for as long as it
  runs one. The kernel drops it when that process dies, however it dies, so a crash never leaves a stale lock;
- ``<store>/nats-server.pid`` names the server started on the store. A server left running by an owner that died
  without stopping it (``kill -9`` where the parent-death signal is not available) is found through it by the
  next owner, once that owner holds the lock, and stopped before a new server starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

from rebaser_core.errors import EmbeddedServerError, StoreInUse

__all__ = ["LOCK_FILE", "PID_FILE", "StoreGuard", "pid_alive"]

log = logging.getLogger(__name__)

LOCK_FILE = "rebaser.lock"
PID_FILE = "nats-server.pid"

# A stale server gets this long for a graceful stop (it flushes the store) before SIGKILL.
_STALE_STOP_TIMEOUT = 10.0
_POLL = 0.02


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a running process (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        # /proc/<pid>/stat: "pid (comm) state ..."; comm may contain spaces or parentheses, state follows the last ')'.
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (not Linux): kill(0) is all we know
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


class StoreGuard:
    """The lock and the PID record of one store directory (see the module docstring)."""

    def __init__(self, store_dir: Path) -> None:
        self.store_dir = Path(store_dir)
        self._lock_fd: int | None = None

    @property
    def lock_path(self) -> Path:
        return self.store_dir / LOCK_FILE

    @property
    def pid_path(self) -> Path:
        return self.store_dir / PID_FILE

    @property
    def held(self) -> bool:
        return self._lock_fd is not None

    def acquire(self) -> None:
        """Take the store's lock (a no-op when held); raise :class:`StoreInUse` if another process holds it."""
        if self._lock_fd is not None:
            return
        self.store_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if sys.platform != "win32":
                import fcntl

                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _read_pid(self.lock_path)
                    by = f"process {holder}" if holder else "another process"
                    raise StoreInUse(
                        f"the store {self.store_dir} is in use by {by}: one nats-server per store",
                        store_dir=str(self.store_dir),
                        holder_pid=holder,
                    ) from None
            # The holder's PID, for the error message a second owner gets (informational: the lock is the flock).
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    def release(self) -> None:
        """Drop the lock (idempotent). The lock file stays: removing it would let two owners lock different files."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor releases the flock

    def stop_stale_server(self, timeout: float = _STALE_STOP_TIMEOUT) -> int | None:
        """Stop a server left running on this store by an owner that is gone; return its PID, or None.

        Only with the lock held (so the server cannot be a live owner's), and only a process that is verifiably a
        nats-server on this store (a recycled PID is left alone).
        """
        assert self.held, "stop_stale_server needs the store lock"
        pid = _read_pid(self.pid_path)
        if pid is None or pid == os.getpid() or not pid_alive(pid):
            self.forget_server()
            return None
        argv = _cmdline(pid)
        if argv is None or not _is_server_on(argv, self.store_dir):
            if argv is None:
                log.warning(
                    "%s names PID %d, which may be a stale nats-server; not stopping it", self.pid_path, pid
                )
            self.forget_server()
            return None
        log.warning(
            "stopping nats-server PID %d left running on %s by an owner that is gone", pid, self.store_dir
        )
        for signum in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
            if _wait_gone(pid, timeout):
                self.forget_server()
                return pid
        raise EmbeddedServerError(f"could not stop nats-server PID {pid} left running on {self.store_dir}")

    def record_server(self, pid: int) -> None:
        assert self.held, "record_server needs the store lock"
        self.pid_path.write_text(f"{pid}\n")

    def forget_server(self) -> None:
        if not self.held:
            return  # the PID file belongs to whoever holds the lock
        with contextlib.suppress(FileNotFoundError):
            self.pid_path.unlink()


def _wait_gone(pid: int, timeout: float) -> bool:
    # Not our child: nothing to wait on but polling.
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)
    return True


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _is_server_on(argv: list[str], store_dir: Path) -> bool:
    if not argv or not Path(argv[0]).name.startswith("nats-server"):
        return False
    wanted = {str(store_dir.absolute()), str(store_dir.resolve())}
    return any(a in wanted for a in argv[1:])
