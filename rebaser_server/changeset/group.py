"""Group commit: requests applied in memory, committed together, answered after the commit.

When more requests of the change set are already waiting (the ordered consumer says so), committing each one
separately costs one JetStream round trip per request. Instead the processor *stages* each outcome here and
commits once for the group: when nothing more is waiting, when the group is full, or after a few milliseconds.
Nothing is answered and nothing is purged from the stream before its commit, so a crash loses nothing that was
acknowledged to anyone: the uncommitted requests are simply processed again by the next owner.

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

from rebaser_core.api import EnqueueUpdatesResponse
from rebaser_server.app import ChangeSet, CommitHooks
from rebaser_server.changeset.replies import UNCHECKED, Unchecked, send_reply
from rebaser_server.changeset.runtime import Runtime
from rebaser_server.changeset.trimmer import Trimmer
from rebaser_server.record.model import ChangeSetRecord
from rebaser_server.record.store import ChangeSetHandle

if TYPE_CHECKING:
    from opentelemetry import trace

__all__ = ["GROUP_MAX", "GROUP_MAX_WAIT", "CommitGroup", "commit_now"]

log = logging.getLogger(__name__)

# A group is committed when nothing more is waiting, when it holds GROUP_MAX requests, or GROUP_MAX_WAIT seconds
# after it could have been (the processor's timer). Its size is also capped at half the idempotency window (see
# Trimmer: every processed request still in the stream must stay within the window).
GROUP_MAX = 32
GROUP_MAX_WAIT = 0.005


def commit_now(size: int, waiting: int, *, one_by_one: bool, idempotency_window: int) -> bool:
    """After a request is staged in a group of ``size`` with ``waiting`` more requests already behind it: commit
    now, or let the group grow (and commit soon, by timer)? ``one_by_one`` after an unclean takeover: the request
    that killed the last owner may sit anywhere in its uncommitted group, and committing one by one puts the blame
    (the suspect count) on the right one."""
    return one_by_one or not waiting or size >= min(GROUP_MAX, idempotency_window // 2)


_OUTCOME_COUNTERS = {"success": "requests_ok", "conflicts": "requests_conflict", "error": "requests_error"}


class CommitGroup:
    def __init__(
        self,
        rt: Runtime,
        change_set: ChangeSet,
        handle: ChangeSetHandle,
        trimmer: Trimmer,
        notify_dvu: Callable[[], None],
    ) -> None:
        self._rt = rt
        self._change_set = change_set
        self._handle = handle
        self._trimmer = trimmer
        self._notify_dvu = notify_dvu
        self._hooks = CommitHooks.of(rt.app)
        self._staged: ChangeSetRecord | None = None
        self._replies: list[tuple[dict[str, str], EnqueueUpdatesResponse, str | Unchecked | None]] = []
        self._dvu = False
        self._applied = 0
        self._seqs: list[int] = []  # stream sequences of the staged requests (removed after the commit)
        self._outcomes: list[str] = []  # reply kinds of the applied requests, counted once committed
        # Spans of the staged requests (only while tracing is on), for the commit span's parent and links.
        self._traces: list[trace.SpanContext] = []
        self.open = False

    def __len__(self) -> int:
        return len(self._seqs)

    @property
    def base(self) -> ChangeSetRecord:
        """The record as of everything staged so far (what the next request is applied to)."""
        return self._staged or self._handle.record

    async def begin(self) -> None:
        if not self.open:
            await self._handle.lock.acquire()
            self.open = True

    def stage(
        self,
        seq: int,
        headers: dict[str, str],
        response: EnqueueUpdatesResponse | None,
        record: ChangeSetRecord | None = None,
        *,
        dvu: bool = False,
        applied: bool = False,
        inbox: str | Unchecked | None = UNCHECKED,
    ) -> None:
        """Add one processed request: its new record (if it changed one), its reply (to ``inbox`` if the handler
        checked it already), whether a DVU is due."""
        if record is not None:
            self._staged = record
        if response is not None:
            self._replies.append((headers, response, inbox))
        if seq:
            self._seqs.append(seq)
        self._dvu = self._dvu or dvu
        self._applied += applied
        if applied and response is not None:
            self._outcomes.append(response.status.kind)
        traced = self._rt.observe.staged()
        if traced is not None and (not self._traces or self._traces[-1] != traced):
            self._traces.append(traced)

    async def flush(self) -> None:
        """Commit what is staged, then answer and purge the group. Raises FencedError if fenced; on any failure
        the group is dropped (its requests stay in the stream and will be processed again)."""
        if not self.open:
            return
        try:
            rt = self._rt
            if self._staged is not None:
                with rt.observe.commit(self._change_set, self._traces):
                    await self._hooks.before_commit(self._change_set, self._staged.state)
                    await self._handle.commit(self._staged)
                rt.stats.request_commits += 1
            await rt.hooks.checkpoint("applied", self._change_set)
            for headers, response, inbox in self._replies:
                await send_reply(rt, headers, response, inbox)
            if self._seqs:
                await self._trimmer.processed(self._seqs)
            rt.stats.requests_applied += self._applied
            for kind in self._outcomes:
                counter = _OUTCOME_COUNTERS[kind]
                setattr(rt.stats, counter, getattr(rt.stats, counter) + 1)
            rt.stats.last_request_at = time.time()
            if self._dvu:
                # The DVU run joins the trace of the group's last request (tracing on).
                rt.observe.dvu_due(self._change_set, self._traces[-1] if self._traces else None)
                self._notify_dvu()
        finally:
            self.abandon()

    async def settle(self, *, owned: bool) -> None:
        """At the end of an ownership: commit and answer what the open group holds; drop it if the change set may
        no longer be ``owned`` (fenced, lease lost). A failed commit is logged: its requests stay in the stream and
        are processed again by the next owner."""
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
        """Drop the group without committing (fenced, or shutting down after a failure)."""
        if not self.open:
            return
        # Also after a commit (prepare_commit then kept nothing) and when nothing was staged: a step's result may
        # have been discarded (lease lost) with nothing staged, and the app must not keep it for ever.
        self._hooks.abandoned(self._change_set)
        self._staged, self._replies, self._seqs, self._dvu, self._applied = None, [], [], False, 0
        self._outcomes = []
        self._traces = []
        self.open = False
        self._handle.lock.release()
