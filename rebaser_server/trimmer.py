"""Removing processed requests from the stream: one purge covers every request of a change set processed so far.

A change set's requests are processed strictly in stream order, so once the request at sequence ``S`` is done,
every earlier request on that subject is done too (applied, or dead-lettered). Instead of one delete per request,
the trimmer purges the subject below ``S + 1``, at most one purge in flight, coalescing everything processed
meanwhile into the next one. Far fewer JetStream API calls under load.

Safety does not depend on the purge: a processed request still in the stream (a purge failed, or the owner died
first) is delivered again, and the change set's record says it was processed (its ``applied_seq`` watermark), so
it is never applied again. The trimmer still never lets more than half the idempotency window of processed
requests wait for a purge (``processed()`` waits until a purge catches up), which keeps a failing purge from
letting the stream grow without bound behind a busy change set.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.runtime import Runtime

__all__ = ["Trimmer"]

log = logging.getLogger(__name__)

_JS_API = "$JS.API"


class Trimmer:
    def __init__(self, rt: Runtime, change_set: ChangeSet, subjects: Subjects | None = None) -> None:
        self._rt = rt
        self._change_set = change_set
        self._names = subjects or rt.subjects  # the shard the change set's task came from
        self._subject = self._names.requests(change_set.workspace_id, change_set.change_set_id)
        self._processed_upto = 0  # stream sequence of the last processed request
        self._purged_upto = 0
        self._unpurged = 0  # processed requests not yet covered by a finished purge
        self._limit = max(1, rt.settings.idempotency_window // 2)
        self._task: asyncio.Task[None] | None = None
        self._caught_up = asyncio.Event()
        self._caught_up.set()

    async def processed(self, seq: int, count: int = 1) -> None:
        """Record that ``count`` requests up to ``seq`` are done; waits only if too many are still unpurged."""
        self._processed_upto = max(self._processed_upto, seq)
        self._unpurged += count
        self._caught_up.clear()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"trim {self._subject}")
        if self._unpurged >= self._limit:
            await self._caught_up.wait()

    async def flush(self, timeout: float) -> None:
        """Wait (bounded) until everything processed so far is purged."""
        try:
            async with asyncio.timeout(timeout):
                await self._caught_up.wait()
        except TimeoutError:
            log.warning("%s: processed requests not yet purged after %.1fs", self._subject, timeout)

    async def _run(self) -> None:
        while self._purged_upto < self._processed_upto:
            target, covered = self._processed_upto, self._unpurged
            try:
                await self._purge_below(target + 1)
            except Exception as err:
                # Best effort by design: left-over requests are skipped by the record's watermark if seen again
                # (the release check republishes the task for them). The next processed request retries.
                self._rt.stats.delete_failures += 1
                log.warning(
                    "%s: purging processed requests up to seq %d failed: %s", self._subject, target, err
                )
                break
            self._purged_upto = target
            self._unpurged -= covered
        self._caught_up.set()

    async def _purge_below(self, seq: int) -> None:
        rt = self._rt
        await rt.hooks.checkpoint("purging", self._change_set)
        subject = f"{_JS_API}.STREAM.PURGE.{self._names.requests_stream}"
        payload = json.dumps({"filter": self._subject, "seq": seq}).encode()
        reply = await rt.requester.request(subject, payload, timeout=rt.settings.nats_timeout)
        data = json.loads(reply.data)
        if "error" in data:
            raise RuntimeError(str(data["error"]))
        rt.stats.last_publish_at = time.time()
