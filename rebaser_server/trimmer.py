"""Removing processed requests from the stream, off the request path, at most one removal in flight per change set.

A change set's requests are processed strictly in stream order, and every message on its subject is delivered to
its owner (the ordered consumer starts at the first one), so every processed request passes through here by its
sequence. Each removal takes everything processed since the last one:

- **a few requests** (up to ``_DELETE_MAX``): deleted by sequence, the deletes sent together. A delete costs the
  server the same whatever else the stream holds;
- **more**: one purge of the subject below the last one's sequence, which covers them all (and any left over by
  an earlier owner). A filtered purge visits every consumer of the stream, one per active change set: with a
  thousand change sets owned it cost the server more than the rest of a request's handling, so it is kept for
  the batches a handful of deletes cannot cover cheaply.

Safety does not depend on removal: a processed request still in the stream (a removal failed, or the owner died
first) is delivered again, and the change set's record says it was processed (its ``applied_seq`` watermark), so
it is never applied again. A failed removal is retried with the next one. The trimmer still never lets more than
half the idempotency window of processed requests wait for removal (``processed()`` waits until one catches up),
which keeps a failing removal from letting the stream grow without bound behind a busy change set.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from nats.js.errors import APIError

from rebaser_core.requester import js_api
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.runtime import Runtime
from rebaser_server.steps import start_step

__all__ = ["Trimmer"]

log = logging.getLogger(__name__)

# Up to this many processed requests are removed by deletes; more by one purge of the subject (see above).
_DELETE_MAX = 8
# What a delete of a message no longer in the stream answers (an earlier removal, or a purge, got there first):
# the message is gone, which is all a removal wants. A memory store says "sequence not found"; a file store fails
# the delete with "no message found", or "stream store EOF" past its last message.
_SEQUENCE_NOT_FOUND = 10043
_DELETE_FAILED = 10057
_FILE_STORE_GONE = frozenset({"no message found", "stream store EOF"})


class Trimmer:
    def __init__(self, rt: Runtime, change_set: ChangeSet, subjects: Subjects | None = None) -> None:
        self._rt = rt
        self._change_set = change_set
        self._names = subjects or rt.subjects  # the shard the change set's task came from
        self._subject = self._names.requests(change_set.workspace_id, change_set.change_set_id)
        self._waiting: list[int] = []  # sequences of processed requests not yet removed
        self._limit = max(1, rt.settings.idempotency_window // 2)
        self._task: asyncio.Task[None] | None = None
        self._caught_up = asyncio.Event()
        self._caught_up.set()

    async def processed(self, seqs: Iterable[int]) -> None:
        """Record that the requests at ``seqs`` are done; waits only if too many are still in the stream."""
        self._waiting.extend(seqs)
        self._caught_up.clear()
        behind = len(self._waiting) >= self._limit  # counted before a removal started below takes them
        if self._task is None or self._task.done():
            # Started inline, so the delete goes out with the group's replies in one write to the server (a new
            # task would send it one event-loop turn later, on its own); the wait for its answer is a task.
            self._task = start_step(self._run()).task
        if behind:
            await self._caught_up.wait()

    async def flush(self, timeout: float) -> None:
        """Wait (bounded) until everything processed so far is removed."""
        try:
            async with asyncio.timeout(timeout):
                await self._caught_up.wait()
        except TimeoutError:
            log.warning("%s: processed requests not yet removed after %.1fs", self._subject, timeout)

    async def _run(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            failure: Exception | None = None
            try:
                left = await self._remove(batch)
            except Exception as err:
                left, failure = batch, err
            else:
                if left:
                    failure = RuntimeError(f"{len(left)} of {len(batch)} deletes failed")
            if failure is not None:
                # Best effort by design: left-over requests are skipped by the record's watermark if seen again
                # (the release check republishes the task for them). They are retried with the next removal.
                self._waiting[:0] = left
                self._rt.stats.delete_failures += 1
                log.warning(
                    "%s: removing processed requests up to seq %d failed: %s",
                    self._subject,
                    max(batch),
                    failure,
                )
                break
        self._caught_up.set()

    async def _remove(self, seqs: list[int]) -> list[int]:
        """Remove the processed requests at ``seqs`` from the stream; return those whose delete failed."""
        rt = self._rt
        await rt.hooks.checkpoint("purging", self._change_set)
        if len(seqs) > _DELETE_MAX:
            await self._purge_below(max(seqs) + 1)
            return []
        if len(seqs) == 1:  # the usual case: no gather (it wraps each delete in a task of its own)
            await self._delete(seqs[0])  # a failure is _run's to report, with its reason
            rt.stats.last_publish_at = time.time()
            return []
        results = await asyncio.gather(*(self._delete(seq) for seq in seqs), return_exceptions=True)
        rt.stats.last_publish_at = time.time()
        return [seq for seq, result in zip(seqs, results, strict=True) if result is not None]

    async def _delete(self, seq: int) -> None:
        rt = self._rt
        subject = f"STREAM.MSG.DELETE.{self._names.requests_stream}"
        try:
            # no_erase: the message's bytes are not overwritten, only dropped (an erase rewrites the block).
            # Formatted, not json.dumps'd: one delete per processed request.
            payload = b'{"seq":%d,"no_erase":true}' % seq
            await js_api(rt.requester, subject, payload, timeout=rt.settings.nats_timeout)
        except APIError as err:
            if not _gone(err):
                raise

    async def _purge_below(self, seq: int) -> None:
        rt = self._rt
        subject = f"STREAM.PURGE.{self._names.requests_stream}"
        await js_api(
            rt.requester, subject, {"filter": self._subject, "seq": seq}, timeout=rt.settings.nats_timeout
        )
        rt.stats.last_publish_at = time.time()


def _gone(error: APIError) -> bool:
    code = error.err_code
    return code == _SEQUENCE_NOT_FOUND or (code == _DELETE_FAILED and error.description in _FILE_STORE_GONE)
