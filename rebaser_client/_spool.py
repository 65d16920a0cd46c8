"""The client's optional durable spool: a bounded FIFO of encoded requests in one SQLite file.

While NATS refuses work (``RebaserBusy``) or cannot be reached (``RebaserUnavailable``), the client stores the
request here, exactly as it would have been published (headers with its ``Nats-Msg-Id``, body), and replays it
later. Storing the encoded message, not the request object, keeps a replay byte-identical to the first attempt,
so the stream's duplicate window drops it if that first attempt did land after all.

One client uses a spool file at a time: the file is opened in SQLite's exclusive locking mode, so a second client
(in this process or another) gets :class:`~rebaser_core.errors.SpoolError` instead of replaying the same requests
concurrently and out of order. Every SQLite call runs in one private worker thread: commits are fsync'ed (the
request must survive a crash once ``enqueue_updates`` returned its id) and must not stall the event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rebaser_core.errors import RebaserBusy, SpoolError

__all__ = ["Spool", "SpoolConfig", "SpooledRequest"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spool (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL,
    subject TEXT NOT NULL,
    headers TEXT NOT NULL,
    body BLOB NOT NULL,
    spooled_at REAL NOT NULL
)
"""
# A full spool frees up as fast as replays are acknowledged; a caller should come back after about this long.
_FULL_RETRY_AFTER = 1.0


@dataclass(frozen=True)
class SpoolConfig:
    """Where and how much a client may spool. Pass as ``RebaserClient(..., spool=SpoolConfig(path))``.

    Args:
        path: the SQLite file (created if missing; reused by the next client, which replays what it holds).
        max_requests: requests held at most; one more is refused with ``RebaserBusy(limit="spool")``.
        max_bytes: encoded bytes held at most (headers and bodies), refused the same way.
        flush_timeout: how long :meth:`RebaserClient.close` waits for the spool to drain while NATS is up.
    """

    path: str | os.PathLike[str]
    max_requests: int = 10_000
    max_bytes: int = 64 * 1024 * 1024
    flush_timeout: float = 5.0

    def __post_init__(self) -> None:
        if self.max_requests < 1 or self.max_bytes < 1:
            raise ValueError("spool max_requests and max_bytes must be positive")
        if self.flush_timeout < 0:
            raise ValueError("spool flush_timeout must not be negative")


@dataclass(frozen=True, slots=True)
class SpooledRequest:
    seq: int
    request_id: str
    subject: str
    headers: dict[str, str]
    body: bytes

    @property
    def size(self) -> int:
        return _size(self.headers, self.body)


def _size(headers: dict[str, str], body: bytes) -> int:
    # The stored form's size: the body plus the headers' JSON (ASCII, so characters are bytes; see _open_db).
    return len(body) + len(json.dumps(headers))


class Spool:
    """A bounded, durable, ordered store of encoded requests. ``await open()`` before use, ``close()`` after."""

    def __init__(self, config: SpoolConfig) -> None:
        self.config = config
        self._executor: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None
        # Kept in memory so "is anything of this change set spooled?" (asked on every enqueue) costs no I/O.
        self._per_subject: Counter[str] = Counter()
        self._count = 0
        self._bytes = 0
        self.added = asyncio.Event()  # set on every add; the replayer waits on it while the spool is empty
        self._empty = asyncio.Event()
        self._empty.set()

    # -- state ------------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return self._count

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def holds(self, subject: str) -> bool:
        """True while requests on ``subject`` (one change set) wait here: later ones must queue behind them."""
        return self._per_subject[subject] > 0

    async def wait_empty(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self._empty.wait()
        except TimeoutError:
            return False
        return True

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def open(self) -> None:
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="rebaser-spool")
        try:
            rows = await self._run(self._open_db)
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise
        for subject, count, size in rows:
            self._per_subject[subject] = count
            self._count += count
            self._bytes += size
        self._set_empty()

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._close_db)
        finally:
            executor.shutdown(wait=False)

    # -- operations ---------------------------------------------------------------------------------------
    async def add(self, request_id: str, subject: str, headers: dict[str, str], body: bytes) -> None:
        """Store one request durably; ``RebaserBusy(limit="spool")`` if that would exceed a bound."""
        size = _size(headers, body)
        if self._count >= self.config.max_requests or self._bytes + size > self.config.max_bytes:
            raise RebaserBusy(
                f"request {request_id} not spooled: the spool is full ({self._count} requests, {self._bytes} "
                f"bytes; limits {self.config.max_requests} and {self.config.max_bytes})",
                retry_after=_FULL_RETRY_AFTER,
                limit="spool",
            )
        # Counted before the write, so an enqueue for the same change set that starts meanwhile queues behind it.
        self._account(subject, 1, size)
        write = asyncio.ensure_future(self._run(lambda: self._insert(request_id, subject, headers, body)))

        def settled(done: asyncio.Future[None]) -> None:
            if done.cancelled() or done.exception() is not None:
                self._account(subject, -1, -size)
            else:
                self.added.set()

        write.add_done_callback(settled)
        # Shielded: a caller cancelled mid-write (say, by its reply timeout) must not leave the counts and the file
        # disagreeing; the write finishes in the worker thread either way and the request is replayed.
        await asyncio.shield(write)

    async def head(self, limit: int) -> list[SpooledRequest]:
        """The oldest ``limit`` requests, oldest first."""
        return await self._run(lambda: self._select(limit))

    async def remove(self, entry: SpooledRequest) -> None:
        await self._run(lambda: self._delete(entry.seq))
        self._account(entry.subject, -1, -entry.size)

    # -- internals (the event loop side) ----------------------------------------------------------------
    def _account(self, subject: str, count: int, size: int) -> None:
        self._per_subject[subject] += count
        if self._per_subject[subject] <= 0:
            del self._per_subject[subject]
        self._count += count
        self._bytes += size
        self._set_empty()

    def _set_empty(self) -> None:
        if self._count == 0:
            self._empty.set()
        else:
            self._empty.clear()

    async def _run(self, fn: Callable[[], T]) -> T:
        if self._executor is None:
            raise SpoolError(f"spool {self.config.path} is not open")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    # -- internals (the worker thread side) -----------------------------------------------------------------
    def _open_db(self) -> list[tuple[str, int, int]]:
        path = Path(self.config.path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(path, isolation_level=None, timeout=0)
        except (OSError, sqlite3.Error) as err:
            raise SpoolError(f"cannot open spool {path}: {err}") from err
        try:
            # Exclusive locking before WAL: the lock is held for the connection's life and WAL needs no shared
            # memory file. synchronous=FULL: a spooled request is on disk before enqueue returns its id.
            db.execute("PRAGMA locking_mode=EXCLUSIVE")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN EXCLUSIVE")
            db.execute(_SCHEMA)
            db.execute("COMMIT")
            rows = db.execute(
                "SELECT subject, COUNT(*), COALESCE(SUM(LENGTH(body) + LENGTH(headers)), 0) "
                "FROM spool GROUP BY subject"
            ).fetchall()
        except sqlite3.Error as err:
            db.close()
            if "locked" in str(err):
                raise SpoolError(f"spool {path} is in use by another client") from err
            raise SpoolError(f"cannot use spool {path}: {err}") from err
        self._db = db
        return [(str(s), int(n), int(b)) for s, n, b in rows]

    def _close_db(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise SpoolError(f"spool {self.config.path} is not open")
        return self._db

    def _insert(self, request_id: str, subject: str, headers: dict[str, str], body: bytes) -> None:
        self._conn().execute(
            "INSERT INTO spool (request_id, subject, headers, body, spooled_at) VALUES (?, ?, ?, ?, ?)",
            (request_id, subject, json.dumps(headers), body, time.time()),
        )

    def _select(self, limit: int) -> list[SpooledRequest]:
        rows = self._conn().execute(
            "SELECT seq, request_id, subject, headers, body FROM spool ORDER BY seq LIMIT ?", (limit,)
        )
        return [
            SpooledRequest(int(seq), str(rid), str(subject), json.loads(headers), bytes(body))
            for seq, rid, subject, headers, body in rows
        ]

    def _delete(self, seq: int) -> None:
        self._conn().execute("DELETE FROM spool WHERE seq = ?", (seq,))
