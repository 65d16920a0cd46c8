"""A FUSE pass-through filesystem that loses whatever was not fsynced: a power cut, simulated.

``LossyFS`` serves a backing directory, but keeps each file's data writes (and truncates) in memory, like a page
cache of dirty pages, until that file is fsynced (``fsync``/``fdatasync``) or the filesystem is unmounted cleanly.
Only then do they reach the backing directory, which plays the disk. Reads see the cached data (read your writes).
:meth:`LossyMount.power_cut` kills the FUSE process with SIGKILL, so every dirty page is dropped, and unmounts: the
backing directory then holds exactly what a disk would after losing power, under the harshest page cache (one
that never writes back on its own).

Simplifications, on purpose:

- Metadata is durable at once: create, mkdir, rename, unlink, rmdir, chmod, chown and utimens go straight to the
  backing directory. A file created and never fsynced therefore comes back *present and empty* (or shorter than
  written). Real filesystems journal metadata, so a rename may also be lost there; this model never loses one.
- Nothing is written back without an fsync (a real kernel writes dirty pages back after ~30 s): the default
  is "lose everything unsynced", the worst case a real disk can show, not the typical one.
- No torn pages, no reordering *within* an fsync: an fsync makes the whole file durable at once.
- ``sync(2)``/``syncfs(2)`` do not reach a FUSE filesystem, so they persist nothing here.
- The backing directory is written without fsync of its own: the host does not lose power, only this process.

Run as ``python lossyfs.py BACKING MOUNTPOINT`` (what :class:`LossyMount` does, in a subprocess, so the caller's
process is never blocked by the FUSE loop). Needs Debian ``fuse3 libfuse3-3`` and PyPI ``mfusepy``
(``scripts/install_powerloss_deps.sh``). Counters: ``os.getxattr(mountpoint, "user.lossyfs.stats")`` (JSON);
``os.setxattr(mountpoint, "user.lossyfs.sync", b"")`` writes every dirty file back (a whole-fs flush).
"""

from __future__ import annotations

import contextlib
import ctypes.util
import errno
import importlib.util
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from rebaser_core.embedded.process import launch_command

PAGE = 4096
STATS_XATTR = "user.lossyfs.stats"
SYNC_XATTR = "user.lossyfs.sync"
FSNAME = "lossyfs"


def missing_dependencies() -> str | None:
    """Why a LossyMount cannot run here, or None. Checked without importing mfusepy (which loads libfuse)."""
    if not Path("/dev/fuse").exists():
        return "/dev/fuse is missing (FUSE is not available in this kernel or container)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK) and not shutil.which("fusermount3"):
        return "/dev/fuse is not usable by this user, and fusermount3 is missing: apt-get install fuse3"
    if not (ctypes.util.find_library("fuse3") or ctypes.util.find_library("fuse")):
        return (
            "libfuse is not installed: apt-get install fuse3 libfuse3-3 (scripts/install_powerloss_deps.sh)"
        )
    if importlib.util.find_spec("mfusepy") is None:
        return (
            "the Python package mfusepy is missing: pip install mfusepy (scripts/install_powerloss_deps.sh)"
        )
    return None


class _File:
    """The page cache of one backing file: dirty pages over a descriptor of the file."""

    def __init__(self, fd: int) -> None:
        self.fd = fd  # kept while the file is open or dirty; it follows renames and survives an unlink
        self.size = os.fstat(fd).st_size  # the size processes see
        # The smallest size since the last sync: backing bytes at or past it were truncated away, they read as zero.
        self.floor = self.size
        self.pages: dict[int, bytearray] = {}
        self.dirty = False
        self.opens = 0

    def _base(self, index: int) -> bytearray:
        start = index * PAGE
        data = os.pread(self.fd, PAGE, start)[: max(0, self.floor - start)]
        return bytearray(data.ljust(PAGE, b"\0"))

    def read(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        if not self.pages and end <= self.floor:
            return os.pread(self.fd, end - offset, offset)  # nothing cached: straight from the disk
        out = bytearray()
        for index in range(offset // PAGE, (end - 1) // PAGE + 1):
            page = self.pages.get(index) or self._base(index)
            lo, hi = max(offset, index * PAGE), min(end, (index + 1) * PAGE)
            out += page[lo - index * PAGE : hi - index * PAGE]
        return bytes(out)

    def write(self, offset: int, data: bytes) -> int:
        pos = 0
        while pos < len(data):
            index, within = divmod(offset + pos, PAGE)
            chunk = data[pos : pos + PAGE - within]
            page = self.pages.get(index)
            if page is None:
                page = self.pages[index] = self._base(index)
            page[within : within + len(chunk)] = chunk
            pos += len(chunk)
        self.size = max(self.size, offset + len(data))
        self.dirty = True
        return len(data)

    def truncate(self, length: int) -> None:
        if length < self.size:
            for index in [i for i in self.pages if i * PAGE >= length]:
                del self.pages[index]
            # The tail of the page that now ends the file must read as zero if the file grows again.
            index, within = divmod(length, PAGE)
            if index in self.pages:
                self.pages[index][within:] = bytes(PAGE - within)
            self.floor = min(self.floor, length)
        self.size = length
        self.dirty = True

    def sync(self) -> int:
        """Write the dirty state to the backing file; the number of bytes written."""
        if not self.dirty:
            return 0
        written = 0
        os.ftruncate(self.fd, self.floor)
        for index in sorted(self.pages):
            data = self.pages[index][: max(0, self.size - index * PAGE)]
            written += os.pwrite(self.fd, data, index * PAGE)
        os.ftruncate(self.fd, self.size)
        self.pages.clear()
        self.floor = self.size
        self.dirty = False
        return written


class LossyFS:
    """The FUSE operations (mfusepy's path-based high-level API, one thread: no locking needed)."""

    use_ns = True  # mfusepy: utimens gets nanoseconds

    def __init__(self, backing: Path) -> None:
        self.root = str(backing.resolve())
        self.files: dict[str, _File] = {}  # path -> cache, for every file open or dirty
        self.handles: dict[int, _File] = {}
        self.next_fh = 1
        self.counts = {"fsync": 0, "fsyncdir": 0, "synced_bytes": 0, "writes": 0, "written_bytes": 0}

    def _real(self, path: str) -> str:
        return self.root + path

    def _lookup(self, path: str, fh: int | None = None) -> _File | None:
        return self.handles.get(fh) if fh else self.files.get(path)

    def _forget(self, path: str) -> None:
        f = self.files.pop(path, None)
        if f is not None and f.opens == 0:
            os.close(f.fd)  # unlinked or replaced, and closed: its dirty pages die with it, as in a kernel

    # -- metadata: straight to the backing directory --------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        f = self._lookup(path, fh)
        st = os.lstat(self._real(path))
        attrs = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino")}
        attrs |= {k: getattr(st, k + "_ns") for k in ("st_atime", "st_mtime", "st_ctime")}
        if f is not None and stat.S_ISREG(st.st_mode):
            attrs["st_size"] = f.size
        return attrs

    def opendir(self, path: str) -> int:
        return os.open(self._real(path), os.O_RDONLY | os.O_DIRECTORY)  # the handle is the descriptor

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(fh)]

    def releasedir(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._real(path))
        self._forget(path)
        return 0

    def rename(self, old: str, new: str) -> int:
        os.rename(self._real(old), self._real(new))
        self._forget(new)
        # The cache follows the file, or every file under a renamed directory.
        for p in [p for p in self.files if p == old or p.startswith(old + "/")]:
            self.files[new + p[len(old) :]] = self.files.pop(p)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._real(path), uid, gid, follow_symlinks=False)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self._real(path), follow_symlinks=False)
        else:
            os.utime(self._real(path), ns=times, follow_symlinks=False)
        return 0

    def symlink(self, target: str, source: str) -> int:
        os.symlink(source, self._real(target))
        return 0

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._real(path))
        keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_namemax")
        return {k: getattr(sv, k) for k in keys}

    # -- data: through the cache ----------------------------------------------------------------------------

    def _open(self, path: str, fd: int | None = None) -> int:
        f = self.files.get(path)
        if f is None:
            f = self.files[path] = _File(fd if fd is not None else os.open(self._real(path), os.O_RDWR))
        elif fd is not None:
            os.close(fd)
        f.opens += 1
        fh, self.next_fh = self.next_fh, self.next_fh + 1
        self.handles[fh] = f
        return fh

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        # The directory entry is durable at once (metadata); the data that follows is not.
        return self._open(path, os.open(self._real(path), os.O_RDWR | os.O_CREAT | (flags & os.O_EXCL), mode))

    def open(self, path: str, flags: int) -> int:
        fh = self._open(path)
        if flags & os.O_TRUNC:  # the kernel passes O_TRUNC here (atomic_o_trunc): a cached truncate
            self.handles[fh].truncate(0)
        return fh

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return self.handles[fh].read(offset, size)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self.counts["writes"] += 1
        self.counts["written_bytes"] += len(data)
        return self.handles[fh].write(offset, data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        f = self._lookup(path, fh)
        if f is None:  # truncate(2) of a closed file: cached until synced, like a write
            f = self.files[path] = _File(os.open(self._real(path), os.O_RDWR))
        f.truncate(length)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0  # close(2) is not a durability point

    def release(self, path: str, fh: int) -> int:
        f = self.handles.pop(fh)
        f.opens -= 1
        if f.opens == 0:
            cached = [p for p, g in self.files.items() if g is f]
            # A closed dirty file stays cached (its descriptor open) until synced, unlinked or lost; a clean one
            # leaves the cache, and so does one that was unlinked or replaced while open.
            if not f.dirty or not cached:
                for p in cached:
                    del self.files[p]
                os.close(f.fd)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self.counts["fsync"] += 1
        self.counts["synced_bytes"] += self.handles[fh].sync()
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self.counts["fsyncdir"] += 1  # metadata is durable already
        return 0

    def sync_all(self) -> None:
        for f in {id(f): f for f in [*self.files.values(), *self.handles.values()]}.values():
            self.counts["synced_bytes"] += f.sync()

    def destroy(self, path: str) -> None:
        self.sync_all()  # a clean unmount writes everything back, as a clean shutdown does

    # -- control, through extended attributes of the root ---------------------------------------------------

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        if path != "/" or name != STATS_XATTR:
            raise OSError(errno.ENODATA, "no such attribute")
        dirty = [f for f in {id(f): f for f in self.files.values()}.values() if f.dirty]
        stats = {**self.counts, "dirty_files": len(dirty), "dirty_pages": sum(len(f.pages) for f in dirty)}
        return json.dumps(stats).encode()

    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        if path != "/" or name != SYNC_XATTR:
            raise OSError(errno.ENOTSUP, "lossyfs takes no extended attributes")
        self.sync_all()
        return 0


def _mounted(mount: Path) -> bool:
    """Whether ``mount`` is a lossyfs mount point right now (from the kernel's table, never touching the path)."""
    target = str(mount.resolve())
    with open("/proc/self/mounts") as table:
        entries = [line.split()[:2] for line in table]
    return [FSNAME, target] in entries


def _umount(mount: Path, *, lazy: bool) -> bool:
    """Unmount; whether it worked. fusermount3 for a user's mount (libfuse made it through that setuid helper),
    umount(8) for root's when fuse3's helper is not installed."""
    for command in (["fusermount3", "-u", *(["-z"] if lazy else [])], ["umount", *(["-l"] if lazy else [])]):
        if shutil.which(command[0]):
            done = subprocess.run([*command, str(mount)], check=False, capture_output=True)
            if done.returncode == 0:
                return True
    return False


class LossyMount:
    """``backing`` served at ``mount`` by a FUSE process of its own (see the module docstring).

    ``with LossyMount(b, m) as lm:`` mounts; :meth:`power_cut` loses the dirty data and unmounts; :meth:`mount`
    mounts again over the same backing directory; leaving the block unmounts cleanly (dirty data written back),
    or kills the process if that does not finish in time."""

    def __init__(self, backing: Path, mount: Path, *, log: Path | None = None) -> None:
        self.backing = Path(backing)
        self.mountpoint = Path(mount)
        self.log = log if log is not None else self.backing.parent / f"{self.mountpoint.name}.lossyfs.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def mount(self, timeout: float = 10.0) -> Self:
        assert self.pid is None, "already mounted"
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, __file__, str(self.backing), str(self.mountpoint)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                # SIGTERM if the owner dies without unmounting: libfuse then unmounts cleanly (see destroy).
                # From the main thread: the signal follows the thread that started the process.
                launch_command(command, die_with_parent=True),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C reaches the test, which unmounts; not this process
            )
        deadline = time.monotonic() + timeout
        while not _mounted(self.mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._kill()
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"lossyfs did not mount {self.mountpoint}:\n{tail}")
            time.sleep(0.01)  # polling the mount table, bounded by the deadline above
        return self

    def stats(self) -> dict[str, int]:
        counters: dict[str, int] = json.loads(os.getxattr(self.mountpoint, STATS_XATTR))
        return counters

    def sync_all(self) -> None:
        os.setxattr(self.mountpoint, SYNC_XATTR, b"")

    def power_cut(self) -> dict[str, int]:
        """Drop every unsynced write and unmount; the counters just before the cut. Kill the processes that write
        to the mount first: whatever they write after the cut fails (ENOTCONN) instead of being lost."""
        before = self.stats()
        self._kill()
        return before

    def unmount(self, timeout: float = 10.0) -> None:
        """Unmount cleanly: the FUSE process writes every dirty file back, then exits (SIGKILL at the deadline)."""
        if self.pid is None:
            self._kill()
            return
        assert self.proc is not None
        # If the mount is busy, the process is killed below (nothing written back): cleanup never hangs.
        if _umount(self.mountpoint, lazy=False):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self._kill()

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)  # by its PID: the dirty pages die with the process
            proc.wait()
        # Lazy: the kernel detaches the dead mount now, even while someone still holds a file in it.
        if _mounted(self.mountpoint) and not _umount(self.mountpoint, lazy=True):
            raise RuntimeError(f"could not unmount {self.mountpoint}")

    def __enter__(self) -> Self:
        return self.mount()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.unmount()


def main(argv: list[str]) -> None:
    import mfusepy  # type: ignore[import-untyped,import-not-found,unused-ignore]

    # An operation that raises is answered with an errno and logged here (stderr: LossyMount's log file).
    logging.basicConfig(level=logging.WARNING, format="lossyfs %(levelname)s %(name)s: %(message)s")

    backing, mount = Path(argv[0]), Path(argv[1])
    # One thread: each operation runs alone, so the cache needs no locks. libfuse's defaults otherwise, on
    # purpose: no writeback_cache (every write reaches this process at once, none waits in the kernel), no
    # auto_unmount (a power cut leaves a dead mount, which LossyMount unmounts itself), and paths for every
    # operation (an open file that is unlinked lives on as .fuse_hidden*, removed when it is closed).
    mfusepy.FUSE(LossyFS(backing), str(mount), foreground=True, nothreads=True, fsname=FSNAME)


if __name__ == "__main__":
    main(sys.argv[1:])
