"""Removing processed requests from the stream, off the request path, at most one removal in flight per change set.

A change set's requests are processed strictly in stream order, and every message on its subject is delivered to
its owner (the ordered consumer starts at the first one), so every processed request passes through here by its
sequence. Each removal takes everything processed since the last one:

- **a few requests** (up to ``_DELETE_MAX``): deleted by sequence, the deletes sent together. A delete costs the
  server the same whatever else the stream holds. Each answer (or its timeout) goes to a callback in nats-py's read
  loop (``Requester.send``): a future, a timer and a task per delete would cost some 6 % of the daemon's
  instructions per request (``bench/instructions.py``);
- **more**: one purge of the subject below the last one's sequence, which covers them all (and any left over by
  an earlier owner). A filtered purge visits every consumer of the stream, one per active change set: with a
  thousand change sets owned it costs the server more than the rest of a request's handling
  (``bench/server_ops.py --removal``), so it is kept for the batches a handful of deletes cannot cover cheaply.

When the servers fsync every write (``sync_interval: always``, as the daemon last checked it:
``Placement.fsync_always``), a delete costs a disk flush per request and a purge one for all it removes, and the
disk, not the CPU, is what limits. Removal then waits up to ``removal_linger`` for more processed requests of the
change set, and purges from two on while the stream has few consumers (:func:`purges`): a busy change set's
removals cost one flush per batch instead of one per request (docs/BENCHMARKS.md, "Durability: the cost of fsync").

Safety does not depend on removal: a processed request still in the stream (a removal failed, or the owner died
first) is delivered again, and the change set's record says it was processed (its ``applied_seq`` watermark), so
it is never applied again. A failed removal is retried with the next one. The trimmer still never lets more than
half the idempotency window of processed requests wait for removal (``processed()`` waits until one catches up),
which keeps a failing removal from letting the stream grow without bound behind a busy change set. While removals
keep failing, what waits is bounded too: past that half window only the last sequence is kept, and the next removal
is one purge below it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Iterable

from nats.js.errors import APIError

from rebaser_core.nats.requester import JS_API, Answer, Requester, js_api
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.context import Placement, Report
from rebaser_server.changeset.steps import start_step

__all__ = ["Trimmer", "purges"]

log = logging.getLogger(__name__)

# Up to this many processed requests are removed by deletes; more by one purge of the subject (see above).
_DELETE_MAX = 8
# Under fsync, a purge of n requests instead of n deletes is worth it while the stream has at most this many
# consumers per request it removes (purges below).
_CONSUMERS_PER_FLUSH = 100
# What a delete of a message no longer in the stream answers (an earlier removal, or a purge, got there first):
# the message is gone, which is all a removal wants. A memory store says "sequence not found"; a file store fails
# the delete with "no message found", or "stream store EOF" past its last message.
_SEQUENCE_NOT_FOUND = 10043
_DELETE_FAILED = 10057
_FILE_STORE_GONE = frozenset({"no message found", "stream store EOF"})


def purges(count: int, *, fsync_always: bool, consumers: int = 0) -> bool:
    """Remove ``count`` processed requests by one purge (True) rather than a delete each (False)?

    ``consumers``: about how many consumers the stream has (the change sets this daemon owns, one each). A purge
    holds the stream while it visits every one of them; under fsync it saves a disk flush per request beyond the
    first, which pays for visiting about ``_CONSUMERS_PER_FLUSH`` consumers (measured: docs/BENCHMARKS.md,
    "Durability: the cost of fsync").
    """
    if count > _DELETE_MAX:
        return True
    return fsync_always and count >= max(2, consumers / _CONSUMERS_PER_FLUSH)


class _Removal:
    """One removal of processed requests: what it removes, and how its deletes' answers stand."""

    __slots__ = ("error", "failed", "left", "over", "seqs")

    def __init__(self, seqs: list[int]) -> None:
        self.seqs = seqs
        self.left = len(seqs)  # deletes not answered yet
        self.failed: list[int] = []
        self.error: Exception | None = None
        self.over = False  # ended (answers arriving later are ignored)


class Trimmer:
    def __init__(
        self,
        change_set: ChangeSet,
        subjects: Subjects,
        *,
        requester: Requester,
        settings: Settings,
        report: Report,
        placement: Placement,
    ) -> None:
        self._requester = requester
        self._placement = placement
        self._linger = settings.removal_linger
        self._timeout = settings.nats_timeout
        self._report = report
        self._change_set = change_set
        self._names = subjects  # the shard the change set's task came from
        self._subject = self._names.requests(change_set.workspace_id, change_set.change_set_id)
        self._delete_subject = f"{JS_API}.STREAM.MSG.DELETE.{self._names.requests_stream}"
        self._waiting: list[int] = []  # sequences of processed requests not yet being removed
        self._limit = max(1, settings.idempotency_window // 2)
        self._removal: _Removal | None = None  # the one in flight
        self._task: asyncio.Task[None] | None = None  # a removal that had to wait (a purge): referenced here
        self._caught_up = asyncio.Event()
        self._caught_up.set()
        self._timer: asyncio.TimerHandle | None = None  # a lingering removal's start
        self._flushing = False  # the change set is being let go: nothing lingers any more
        # Removals kept failing until more than ``_limit`` sequences waited: only the last is kept, and the next
        # removal is a purge below it, which covers every earlier one (until a purge succeeds).
        self._purge_all = False

    async def processed(self, seqs: Iterable[int]) -> None:
        """Record that the requests at ``seqs`` are done; waits only if too many are still in the stream."""
        self._waiting.extend(seqs)
        self._caught_up.clear()
        # Counted before a removal started below takes them.
        removing = self._removal.left if self._removal is not None else 0
        behind = len(self._waiting) + removing >= self._limit
        if self._removal is None:
            # Started inline, so the deletes go out with the group's replies in one write to the server; their
            # answers come back to _answered, in nats-py's read loop. Only a purge waits, in a task of its own.
            self._start(now=behind)
        if behind:
            await self._caught_up.wait()

    async def flush(self, timeout: float) -> None:
        """Wait (bounded) until everything processed so far is removed."""
        self._flushing = True
        if self._timer is not None and self._removal is None:
            self._start()  # what lingers goes now (a failed removal waits for the next, as ever)
        try:
            async with asyncio.timeout(timeout):
                await self._caught_up.wait()
        except TimeoutError:
            log.warning("%s: processed requests not yet removed after %.1fs", self._subject, timeout)

    def _start(self, *, now: bool = False) -> None:
        """Start removing everything waiting (one removal at a time), or say it is all removed. Unless ``now``,
        a removal lingers for more while the servers fsync every write."""
        if not self._waiting:
            self._caught_up.set()
            return
        now = now or self._flushing or len(self._waiting) >= self._limit
        if not now and self._linger > 0 and self._placement.fsync_always:
            if self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self._linger, self._lingered)
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        removal = self._removal = _Removal(self._waiting)
        self._waiting = []
        task = start_step(self._begin(removal)).task
        if task is not None:
            self._task = task

    def _lingered(self) -> None:
        self._timer = None
        if self._removal is None:
            self._start(now=True)

    async def _begin(self, removal: _Removal) -> None:
        try:
            if await self._remove(removal):
                return  # deletes sent: their answers end the removal
        except Exception as err:
            self._ended(removal, removal.seqs, err)
            return
        self._ended(removal, [], None)

    async def _remove(self, removal: _Removal) -> bool:
        """Remove the processed requests of ``removal`` from the stream: a purge, done when this returns (False);
        or deletes by sequence, sent when this returns, each answer going to :meth:`_answered` (True). Raises if
        the removal failed (whether or not part of it reached the server)."""
        await self._report.hooks.checkpoint("purging", self._change_set)
        seqs = removal.seqs
        placement = self._placement
        if self._purge_all or purges(
            len(seqs), fsync_always=placement.fsync_always, consumers=placement.owned
        ):
            await self._purge_below(max(seqs) + 1)
            self._purge_all = False
            return False
        timeout = self._timeout
        for seq in seqs:
            # no_erase: the message's bytes are not overwritten, only dropped (an erase rewrites the block).
            # Formatted, not json.dumps'd: one delete per processed request. Sent by send(), not request(): no
            # future, task or timer per delete.
            payload = b'{"seq":%d,"no_erase":true}' % seq
            await self._requester.send(
                self._delete_subject,
                payload,
                timeout=timeout,
                on_answer=functools.partial(self._answered, removal, seq),
            )
        return True

    def _answered(self, removal: _Removal, seq: int, answer: Answer) -> None:
        if removal.over:
            return  # the removal already failed (see _begin)
        # Whatever the answer holds, the removal must end: else no other would ever start.
        try:
            error = _delete_error(answer)
        except Exception as err:
            error = err
        if error is not None:
            removal.failed.append(seq)
            removal.error = error
        removal.left -= 1
        if removal.left == 0:
            self._ended(removal, removal.failed, removal.error)

    def _ended(self, removal: _Removal, failed: list[int], error: Exception | None) -> None:
        if removal.over:
            return
        removal.over = True
        self._removal = None
        if len(failed) < len(removal.seqs):
            self._report.stats.last_publish_at = time.time()
        if failed:
            # Best effort by design: left-over requests are skipped by the record's watermark if seen again (the
            # release check republishes the task for them). They are retried with the next removal; meanwhile
            # nobody waits for this one (flush and a busy processed() return).
            self._waiting[:0] = failed
            if len(self._waiting) > self._limit:
                # Bounded while removals keep failing: one purge below the last covers them all.
                self._waiting = [max(self._waiting)]
                self._purge_all = True
            self._report.stats.delete_failures += 1
            why = (
                error
                if len(failed) == len(removal.seqs)
                else f"{len(failed)} of {len(removal.seqs)} deletes failed"
            )
            log.warning(
                "%s: removing processed requests up to seq %d failed: %s",
                self._subject,
                max(removal.seqs),
                why,
            )
            self._caught_up.set()
            return
        self._start()

    async def _purge_below(self, seq: int) -> None:
        subject = f"STREAM.PURGE.{self._names.requests_stream}"
        await js_api(self._requester, subject, {"filter": self._subject, "seq": seq}, timeout=self._timeout)


def _delete_error(answer: Answer) -> Exception | None:
    """None if a delete's answer says the message is gone (deleted now, or before); else why it failed."""
    if isinstance(answer, Exception):
        return answer
    if b'"success":true' in answer.data:
        return None
    try:
        parsed = json.loads(answer.data)
    except ValueError as err:
        return err
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        return ValueError(f"unexpected answer to a delete: {answer.data[:200]!r}")
    try:
        APIError.from_error(error)  # raises the error's nats-py type
    except APIError as err:
        return None if _gone(err) else err
    return ValueError(f"unexpected answer to a delete: {answer.data[:200]!r}")


def _gone(error: APIError) -> bool:
    code = error.err_code
    return code == _SEQUENCE_NOT_FOUND or (code == _DELETE_FAILED and error.description in _FILE_STORE_GONE)
