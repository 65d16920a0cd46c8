"""Carrying out a request's decision: the one step between deciding (:mod:`~rebaser_server.changeset.handling`) and
what a decision does to the world (:meth:`CommitGroup.flush <rebaser_server.changeset.group.CommitGroup.flush>`).

:class:`PostProcess` stages each decision in the change set's commit group and decides when the group is carried
out: at once for an attempt that must be on record before anything else happens (COUNTED, RETRY), else when
:func:`~rebaser_server.changeset.group.commit_now` says so, or by a short timer while the next request is on its
way. It is the only place that flushes a group; :meth:`PostProcess.settle` carries out what is left when the
ownership ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rebaser_server.changeset.decisions import Decision
from rebaser_server.changeset.group import GROUP_MAX_WAIT, CommitGroup, commit_now
from rebaser_server.record.model import ChangeSetRecord

__all__ = ["PostProcess"]


class PostProcess:
    """The post-process step of one owned change set.

    ``lock`` is held while a request is handled (the processor's): the timer's flush takes it too, so it never
    cuts into a request's decision. ``on_failure`` ends the task when a flush by the timer fails.
    ``one_by_one``: commit every request on its own (after an unclean takeover; see ``commit_now``).
    """

    def __init__(
        self,
        group: CommitGroup,
        *,
        lock: asyncio.Lock,
        one_by_one: bool,
        idempotency_window: int,
        on_failure: Callable[[Exception], None],
    ) -> None:
        self._group = group
        self._lock = lock
        self._one_by_one = one_by_one
        self._window = idempotency_window
        self._on_failure = on_failure
        self._timer: asyncio.Task[None] | None = None

    async def open(self) -> ChangeSetRecord:
        """The record the next request is decided against, the group opened for it (taking the commit lock)."""
        await self._group.begin()
        return self._group.base

    async def carry_out(self, decision: Decision, waiting: int) -> None:
        """Stage ``decision``, with ``waiting`` more requests already behind it, and carry the group out now or
        soon. A RETRY raises its error once its attempt is committed: the task ends, the request first in line."""
        group = self._group
        group.stage(decision, waiting)
        if not decision.processed:  # COUNTED, RETRY: the request stays first in line
            await group.flush()  # what came before is answered; the attempt is on record
            if decision.error is not None:
                raise decision.error
            return
        if commit_now(len(group), waiting, one_by_one=self._one_by_one, idempotency_window=self._window):
            await group.flush()
        elif self._timer is None or self._timer.done():
            self._timer = asyncio.create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        # The next request may be slow to arrive (flow control, a consumer reset): do not let replies wait for it.
        await asyncio.sleep(GROUP_MAX_WAIT)
        async with self._lock:
            if self._group.open:
                try:
                    await self._group.flush()
                except Exception as err:
                    self._on_failure(err)

    async def settle(self, *, owned: bool) -> None:
        """The ownership ends: carry out the open group, or drop it if the change set may no longer be ``owned``."""
        await self._group.settle(owned=owned)
