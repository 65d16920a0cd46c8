"""Group commit: requests decided in memory, committed together, answered after the commit.

When more requests of the change set are already waiting (the ordered consumer says so), committing each one
separately costs one JetStream round trip per request. Instead each request's decision is *staged* here and the
group is carried out at once: when nothing more is waiting, when the group is full, or after a few milliseconds
(the post-process step decides when: :mod:`~rebaser_server.changeset.postprocess`).

:meth:`CommitGroup.flush` carries out the group's decisions, in this order:

1. the **dead letters** (before the commit: a crash in between leaves the requests unprocessed, and the next owner
   copies them again, deduplicated by their stream sequence; after it, a crash would lose the copies);
2. the record's **commit** (compare-and-set: fenced if another owner took over), with the group's **events**
   numbered and in its window, which the write carries (and, with the events stream on, in its outbox, published
   right after it: :mod:`~rebaser_server.changeset.events`);
3. the **counters**, then the **replies** (never before the commit, so no reply announces what a crash could undo);
4. the **removal** of the processed requests from the stream (:mod:`~rebaser_server.changeset.trimmer`);
5. the **DVU** notification, if an applied request made one due.

A crash loses nothing that was acknowledged to anyone: the uncommitted requests are simply processed again by the
next owner.

While a group is open it holds the change set's commit lock, so a DVU run can never interleave with it.

The app's ``prepare_commit`` (optional, see :mod:`rebaser_server.app`) runs with the state about to be committed
before the compare-and-set, so what the record points to exists before the record does; ``abandon_commit`` runs
when the group ends, committed or not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rebaser_server.app import ChangeSet, CommitHooks
from rebaser_server.changeset.context import Report
from rebaser_server.changeset.decisions import Decision, Kind
from rebaser_server.changeset.events import ChangeSetFeed
from rebaser_server.changeset.replies import Replies
from rebaser_server.changeset.trimmer import Trimmer
from rebaser_server.record.handle import ChangeSetHandle
from rebaser_server.record.model import ChangeSetRecord

if TYPE_CHECKING:
    from opentelemetry import trace

__all__ = ["GROUP_MAX", "GROUP_MAX_WAIT", "CommitGroup", "commit_now"]

log = logging.getLogger(__name__)

# A group is committed when nothing more is waiting, when it holds GROUP_MAX requests, or GROUP_MAX_WAIT seconds
# after it could have been (the post-process step's timer). Its size is also capped at half the idempotency window (see
# Trimmer: every processed request still in the stream must stay within the window).
GROUP_MAX = 32
GROUP_MAX_WAIT = 0.005


def commit_now(size: int, waiting: int, *, one_by_one: bool, idempotency_window: int) -> bool:
    """After a request is staged in a group of ``size`` with ``waiting`` more requests already behind it: commit
    now, or let the group grow (and commit soon, by timer)? ``one_by_one`` after an unclean takeover: the request
    that killed the last owner may sit anywhere in its uncommitted group, and committing one by one puts the blame
    (the suspect count) on the right one."""
    return one_by_one or not waiting or size >= min(GROUP_MAX, idempotency_window // 2)


_OUTCOME_COUNTERS = {
    "success": "requests_ok",
    "conflicts": "requests_conflict",
    "error": "requests_error",
    "refused": "requests_refused",
}


class CommitGroup:
    """The open group of one owned change set: staged decisions, carried out together by :meth:`flush`."""

    def __init__(
        self,
        change_set: ChangeSet,
        handle: ChangeSetHandle,
        *,
        commit_hooks: CommitHooks,
        trimmer: Trimmer,
        replies: Replies,
        report: Report,
        feed: ChangeSetFeed,
        notify_dvu: Callable[[], None],
    ) -> None:
        self._change_set = change_set
        self._handle = handle
        self._commit_hooks = commit_hooks
        self._trimmer = trimmer
        self._replies = replies
        self._report = report
        self._feed = feed
        self._notify_dvu = notify_dvu
        self._waiting: list[int] = []  # requests already behind each one staged (its event says so)
        self._staged: ChangeSetRecord | None = None
        self._decisions: list[Decision] = []
        self._seqs: list[
            int
        ] = []  # stream sequences of the staged requests that leave the stream once committed
        self._dvu = False
        # Spans of the staged requests (only while tracing is on), for the commit span's parent and links.
        self._traces: list[trace.SpanContext] = []
        self.open = False

    def __len__(self) -> int:
        """Requests staged that leave the stream once committed."""
        return len(self._seqs)

    @property
    def base(self) -> ChangeSetRecord:
        """The record as of everything staged so far (what the next request is decided against)."""
        return self._staged or self._handle.record

    async def begin(self) -> None:
        """Open the group (if it is not open): it holds the change set's commit lock until it ends."""
        if not self.open:
            await self._handle.lock.acquire()
            try:
                # A commit that got no answer and could not be read back may have been stored: decided against the
                # record before it, this group would apply its requests again and give their events' seq again.
                if self._handle.write_unanswered and await self._handle.refresh_after_lost_write():
                    await self._feed.adopted(self._handle.record)
            except BaseException:
                self._handle.lock.release()
                raise
            self.open = True

    def stage(self, decision: Decision, waiting: int = 0) -> None:
        """Add one request's decision to the group (``waiting`` more requests already behind it)."""
        self._waiting.append(waiting)
        if decision.record is not None:
            self._staged = decision.record
        self._decisions.append(decision)
        if decision.processed:
            self._seqs.append(decision.seq)
        self._dvu = self._dvu or decision.dvu
        traced = self._report.observe.staged()
        if traced is not None and (not self._traces or self._traces[-1] != traced):
            self._traces.append(traced)

    async def flush(self) -> None:
        """Carry out the staged decisions (the order is in the module's docstring). Raises FencedError if fenced;
        on any failure the group is dropped (its requests stay in the stream and are processed again)."""
        if not self.open:
            return
        try:
            report, change_set, decisions = self._report, self._change_set, self._decisions
            for decision in decisions:
                if decision.dead_letter is not None:
                    await self._replies.dead_letter(
                        decision.msg, decision.seq, decision.dead_letter, trace=decision.trace
                    )
            staged = self._staged
            if staged is not None:
                # Settled once committed: nothing queued behind the last request, no DVU due.
                settled = not self._waiting[-1] and not staged.dvu_pending and decisions[-1].processed
                staged = self._feed.stage(staged, decisions, self._waiting, settled=settled)
                with report.observe.commit(change_set, self._traces):
                    await self._commit_hooks.before_commit(change_set, staged.state)
                    await self._handle.commit(staged)
                report.stats.request_commits += 1
                await self._feed.committed()
            await report.hooks.checkpoint("applied", change_set)
            self._count(decisions)
            for decision in decisions:
                if decision.response is not None:
                    await self._replies.send(decision.msg.headers or {}, decision.response, decision.inbox)
            if self._seqs:
                await self._trimmer.processed(self._seqs)
            if self._dvu:
                # The DVU run joins the trace of the group's last request (tracing on).
                report.observe.dvu_due(change_set, self._traces[-1] if self._traces else None)
                self._notify_dvu()
        finally:
            self._feed.dropped()  # staged events not published by now were never committed
            self.abandon()

    def _count(self, decisions: list[Decision]) -> None:
        stats = self._report.stats
        for decision in decisions:
            if decision.kind is Kind.APPLIED:
                stats.requests_applied += 1
                if decision.response is not None:
                    counter = _OUTCOME_COUNTERS[decision.response.status.kind]
                    setattr(stats, counter, getattr(stats, counter) + 1)
            elif decision.kind is Kind.REPLAYED:
                stats.requests_replayed += 1
            elif decision.kind is Kind.RETRY:
                stats.requests_retried += 1
        stats.last_request_at = time.time()

    async def settle(self, *, owned: bool) -> None:
        """At the end of an ownership: carry out what the open group holds; drop it if the change set may no longer
        be ``owned`` (fenced, lease lost). A failed commit is logged: its requests stay in the stream and are
        processed again by the next owner."""
        if not self.open:
            return
        if not owned:
            self.abandon()
            return
        try:
            await self.flush()
        except Exception as err:
            log.warning("%s: committing the last group failed: %r", self._change_set, err)

    def abandon(self) -> None:
        """Drop the group without carrying it out (fenced, or shutting down after a failure)."""
        if not self.open:
            return
        # Also after a commit (prepare_commit then kept nothing) and when nothing was staged: a step's result may
        # have been discarded (lease lost) with nothing staged, and the app must not keep it for ever.
        self._commit_hooks.abandoned(self._change_set)
        self._staged, self._decisions, self._seqs, self._dvu, self._traces = None, [], [], False, []
        self._waiting = []
        self.open = False
        self._handle.lock.release()
