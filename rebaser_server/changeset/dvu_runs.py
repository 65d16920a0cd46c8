"""The dependent values updates of one owned change set: when a due one may run, and the run itself.

The processor's requests say a DVU is due (``notify``, from the commit group); :class:`SerialDvu` coalesces those
into at most one more run. Each run here first waits for its turn, paced against the requests (see
:meth:`ChangeSetDvu._wait_for_turn`), then runs the app's ``dependent_values_update`` as a step under the lease and
commits its state with the same compare-and-set as a request group, under the record's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace

from rebaser_core.errors import FencedError
from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet, CommitHooks, RebaserApp
from rebaser_server.changeset.context import Report
from rebaser_server.changeset.dvu import SerialDvu
from rebaser_server.changeset.events import ChangeSetFeed
from rebaser_server.changeset.outcome import LeaseLost, Outcome, Wedged
from rebaser_server.changeset.steps import Steps
from rebaser_server.record.handle import ChangeSetHandle
from rebaser_server.task.lease import Lease

__all__ = ["Activity", "ChangeSetDvu"]

# A due DVU runs once no request has come for this long (or dvu_max_delay after it became due).
_DVU_QUIET = 0.01


class Activity:
    """The owned change set's requests as a due DVU sees them: when the last one was handled (``last``, monotonic),
    and ``lull``, set while none is waiting."""

    __slots__ = ("last", "lull")

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.lull = asyncio.Event()
        self.lull.set()


def _ended(outcome: Outcome, delay: float, reason: str) -> None:
    """The ``finish`` of a stopped change set's DVU runs."""


class ChangeSetDvu:
    def __init__(
        self,
        change_set: ChangeSet,
        *,
        app: RebaserApp,
        settings: Settings,
        report: Report,
        steps: Steps,
        lease: Lease,
        activity: Activity,
        feed: ChangeSetFeed,
        finish: Callable[[Outcome, float, str], None],
    ) -> None:
        self._app = app
        self._max_delay = settings.dvu_max_delay
        self._report = report
        self._change_set = change_set
        self._steps = steps
        self._lease = lease
        self._activity = activity
        self._feed = feed
        self._finish = finish  # ends the ownership (fenced, lease lost, wedged)
        self._handle: ChangeSetHandle | None = None
        self._took = 0.0  # how long the last run took, and when it ended (monotonic)
        self._ended = 0.0
        self._loop = SerialDvu(
            self._run,
            name=f"dvu {change_set}",
            retry_backoff=settings.retry_backoff,
            retry_backoff_max=settings.retry_backoff_max,
        )

    def start(self, handle: ChangeSetHandle) -> None:
        """Start the loop on the acquired record; a DVU left due by the previous owner runs at once."""
        self._handle = handle
        self._loop.start()
        if handle.record.dvu_pending:
            self._loop.notify()  # the previous owner died with a DVU due

    def notify(self) -> None:
        self._loop.notify()

    async def drain(self) -> None:
        await self._loop.drain()

    async def stop(self, timeout: float) -> None:
        await self._loop.stop(timeout=timeout)
        # Once stopped, nothing is ended from here (a run left behind has nobody to end). ``finish`` is the processor's
        # method, and the processor holds this object: without this the pair is freed only by the cycle collector.
        self._finish = _ended

    async def _wait_for_turn(self) -> None:
        max_delay = self._max_delay
        activity = self._activity
        # A costly DVU must not run in every short lull of a steady stream of requests: after a run that took d
        # seconds, requests get at least d (at most dvu_max_delay) before the next one starts, so DVU runs take at
        # most about half the change set's time while requests keep coming, and a burst shares few runs.
        spacing = min(self._took, max_delay) - (time.monotonic() - self._ended)
        if spacing > 0:
            await asyncio.sleep(spacing)
        # Then a lull that lasts _DVU_QUIET (a burst's requests arrive closer together than that), at most
        # dvu_max_delay after the run became due. asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a
        # cancellation that arrives just as the awaited thing completes, and a swallowed cancel would keep
        # SerialDvu.stop() waiting for ever.
        deadline = time.monotonic() + max_delay
        while (remaining := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await activity.lull.wait()
            quiet_for = time.monotonic() - activity.last
            if activity.lull.is_set() and quiet_for >= _DVU_QUIET:
                break
            await asyncio.sleep(min(max(_DVU_QUIET - quiet_for, 0.001), max(remaining, 0.0)))

    async def _run(self) -> None:
        handle = self._handle
        assert handle is not None
        await self._wait_for_turn()
        report, change_set = self._report, self._change_set
        started = time.monotonic()
        try:
            # The DVU run's trace span (rebaser_server.ops.observe).
            async with handle.lock, report.observe.dvu(change_set):
                if not self._lease.held():
                    raise LeaseLost()
                if await handle.refresh_after_lost_write():
                    await self._feed.adopted(handle.record)
                record = handle.record
                hooks = CommitHooks.of(self._app)
                feed = self._feed
                await feed.notice("dvu_started")
                try:
                    state = await self._steps.run(self._app.dependent_values_update(change_set, record.state))
                    # What the state points to is written before the record that points to it is committed.
                    await hooks.before_commit(change_set, state)
                    updated = replace(handle.record, state=state, dvu_pending=False)
                    settled = self._activity.lull.is_set()  # no request waiting (this run left no DVU due)
                    await handle.commit(feed.stage_dvu(updated, time.monotonic() - started, settled=settled))
                except BaseException as err:
                    feed.dropped()
                    hooks.abandoned(change_set)
                    if isinstance(err, Exception) and not isinstance(err, FencedError | LeaseLost):
                        await feed.notice("dvu_failed", error=type(err).__name__[:128])
                    raise
                await feed.committed()
            report.stats.dvu_runs += 1
            self._ended = time.monotonic()
            self._took = self._ended - started
        except FencedError as err:
            self._finish(Outcome.FENCED, 0.0, str(err))
        except LeaseLost:
            self._finish(Outcome.LEASE_LOST, 0.0, "lease ran out during a dependent values update")
        except Wedged:
            self._finish(Outcome.WEDGED, 0.0, "dependent values update overran handler_deadline")
        except Exception:
            report.stats.dvu_failures += 1
            raise
