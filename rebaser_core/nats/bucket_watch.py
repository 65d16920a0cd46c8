"""A watch of every key of a KV bucket whose "initial values loaded" marker can be trusted.

nats-py's ``KeyValue.watch`` puts its end-of-initial-values marker (``None``) first when the consumer info it reads
at set-up says nothing is pending and nothing has arrived yet. But the server counts a value as delivered when it
queues it, and the consumer info can reach the client before the values do: the marker then comes *before* the
values (about 1 watch in 300 on an idle machine, more under load). A reader that takes the marker for "everything is
in" misses what the bucket holds: ``rebaser status`` listed no pauses, and a starting daemon could take a paused
change set for unpaused until the values arrived.

:func:`watch_bucket` reads the bucket's last sequence before the watch starts, and gives the marker itself, exactly
once: when the bucket was empty, or after the value that carries no pending count, or after the value at (or past)
that sequence, or after a marker of nats-py's that follows a value (put only when nothing was pending). Deletes are
filtered here, not in nats-py, so a bucket whose last entry is a delete still ends its initial values. A bucket
emptied between that look and the watch's start ends them when ``updates`` has waited its whole timeout and the
consumer says nothing is pending.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

__all__ = ["WATCH_IDLE", "BucketWatch", "bucket_keys", "stop_watch", "watch_bucket"]

log = logging.getLogger(__name__)

# A KV watch is an ordered consumer on the bucket's stream; nats-py keeps one 5 min after its watcher died.
WATCH_IDLE = 30.0


class BucketWatch:
    """Updates of every key of a bucket: each key's last value, then ``None`` once, then the changes.

    ``updates(timeout)`` (raises nats-py's TimeoutError) and ``async for`` read it, as nats-py's ``KeyWatcher``."""

    def __init__(
        self, inner: KeyValue.KeyWatcher, *, values: int, last_seq: int, ignore_deletes: bool
    ) -> None:
        self._inner = inner
        self._last_seq = last_seq
        self._ignore_deletes = ignore_deletes
        self._seen_value = False
        self._marker_due = values == 0  # an empty bucket: loaded at once
        self._loaded = values == 0

    @property
    def consumer_subscription(self) -> Any:
        """nats-py's subscription of the watch's ordered consumer (its name can change as the watch resets)."""
        return self._inner._sub

    async def updates(self, timeout: float | None = 5.0) -> KeyValue.Entry | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._marker_due:
                self._marker_due = False
                return None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                entry = await self._inner.updates(timeout=left)  # type: ignore[no-untyped-call]
            except nats.errors.TimeoutError:
                if self._seen_value or self._loaded or not await self._nothing_pending():
                    raise
                # Emptied between the look at the bucket and the watch's start: nothing came in a whole timeout,
                # and the consumer says nothing is pending (no value can still be on its way after so long).
                self._loaded = True
                return None
            kept = self._take(entry)
            if kept is not None:
                return kept

    def __aiter__(self) -> BucketWatch:
        return self

    async def __anext__(self) -> KeyValue.Entry | None:
        while True:
            if self._marker_due:
                self._marker_due = False
                return None
            entry = await self._inner.__anext__()  # type: ignore[no-untyped-call]  # (StopAsyncIteration once stopped)
            kept = self._take(entry)
            if kept is not None:
                return kept

    def _take(self, entry: KeyValue.Entry | None) -> KeyValue.Entry | None:
        """What to hand on of nats-py's ``entry`` (None: nothing, or the marker, now due)."""
        if not isinstance(entry, KeyValue.Entry):
            # nats-py's marker. The one put at set-up may come before the values; one that follows a value is put
            # only when nothing was pending, so it is right.
            if self._seen_value and not self._loaded:
                self._loaded = self._marker_due = True
            return None
        self._seen_value = True
        if not self._loaded and (entry.delta == 0 or (entry.revision or 0) >= self._last_seq):
            self._loaded = self._marker_due = True
        if self._ignore_deletes and entry.operation in (KV_DEL, KV_PURGE):
            return None
        return entry

    async def _nothing_pending(self) -> bool:
        try:
            info = await self.consumer_subscription.consumer_info()
        except Exception:
            return False
        return not info.num_pending

    async def stop(self) -> None:
        await self._inner.stop()  # type: ignore[no-untyped-call]


async def watch_bucket(kv: KeyValue, *, ignore_deletes: bool = False, meta_only: bool = False) -> BucketWatch:
    """Watch every key of ``kv`` (``meta_only``: without the values). Its consumer goes WATCH_IDLE after its process
    died (a SIGKILL), and at once with :func:`stop_watch`."""
    state = (await kv.status()).stream_info.state
    inner = await kv.watchall(inactive_threshold=WATCH_IDLE, meta_only=meta_only)
    return BucketWatch(inner, values=state.messages, last_seq=state.last_seq, ignore_deletes=ignore_deletes)


async def bucket_keys(js: JetStreamContext, bucket: str, *, timeout: float = 5.0) -> list[str]:
    """The keys of KV bucket ``bucket`` that hold a value now (nats-py's ``keys()`` can miss them all, as its watch
    does). Raises BucketNotFoundError if there is no such bucket, nats-py's TimeoutError if it does not answer."""
    kv = await js.key_value(bucket)
    watcher = await watch_bucket(kv, ignore_deletes=True, meta_only=True)
    try:
        keys = []
        while (entry := await watcher.updates(timeout=timeout)) is not None:
            keys.append(entry.key)
        return keys
    finally:
        await stop_watch(js, bucket, watcher)


async def stop_watch(js: JetStreamContext, bucket: str, watcher: BucketWatch) -> None:
    """Stop ``watcher`` (of KV bucket ``bucket``) and delete its consumer: unsubscribing alone leaves it for its
    inactive threshold. Best effort: a consumer that cannot be deleted now goes by itself after WATCH_IDLE."""
    name = None
    try:
        name = (await watcher.consumer_subscription.consumer_info()).name
    except Exception as err:
        log.info(
            "a watch of %s: its consumer could not be read (%r); it goes after %.0f s",
            bucket,
            err,
            WATCH_IDLE,
        )
    with contextlib.suppress(Exception):
        await watcher.stop()
    if name is not None:
        try:
            await js.delete_consumer(f"KV_{bucket}", name)
        except Exception as err:
            log.info(
                "a watch of %s: deleting its consumer failed (%r); it goes after %.0f s",
                bucket,
                err,
                WATCH_IDLE,
            )
