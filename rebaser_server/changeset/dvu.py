"""The serial dependent-values-update (DVU) loop of one change set.

``notify()`` stores a single permit. The loop takes the permit and runs one DVU; notifications that arrive while
a run is in progress set the permit again, so any burst of them during one run yields exactly one more run, never
zero (a notification is never lost) and never more than one (they coalesce).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from rebaser_core.nats import cancellation

__all__ = ["SerialDvu"]

log = logging.getLogger(__name__)


async def _never_run() -> None:
    """The run of a stopped loop."""


class SerialDvu:
    def __init__(
        self,
        run: Callable[[], Awaitable[None]],
        *,
        name: str = "dvu",
        retry_backoff: float = 1.0,
        retry_backoff_max: float = 60.0,
    ) -> None:
        self._run = run
        self._name = name
        self._retry_backoff = retry_backoff
        self._retry_backoff_max = retry_backoff_max
        self._permit = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        # Checked by the loop besides cancelling it: a cancellation that lands as a NATS answer arrives can be
        # swallowed (asyncio.wait_for in Python 3.11, inside nats-py), and the loop must not run on for a change set
        # its processor no longer holds.
        self._stopped = False
        self._started = False
        self.runs = 0
        self.failures = 0

    def start(self) -> None:
        """Let runs happen. The loop's task is created by the first notification: most change sets never need a
        DVU (every literal nobody reads), and a task per activation is measurable under a burst of them."""
        self._started = True
        if self._permit.is_set():
            self._spawn()

    def _spawn(self) -> None:
        if self._task is None and not self._stopped:
            self._task = asyncio.create_task(self._loop(), name=self._name)

    def notify(self) -> None:
        self._permit.set()
        self._idle.clear()
        if self._started:
            self._spawn()

    @property
    def pending(self) -> bool:
        """A run is in progress or due."""
        return not self._idle.is_set()

    async def drain(self) -> None:
        """Wait until no run is in progress and none is due."""
        await self._idle.wait()

    async def stop(self, timeout: float = 5.0) -> None:
        """Cancel the loop (and a run in progress), waiting at most ``timeout`` for it to end. Pending work is the
        caller's to persist."""
        task, self._task = self._task, None
        self._stopped = True
        # A stopped loop never calls run again. Let go of it: it is usually a method of the loop's owner, which
        # holds the loop, and that cycle would keep the owner's whole change set alive until the cycle collector
        # found it (a daemon lets thousands of change sets go in a burst).
        self._run = _never_run
        if task is not None:
            task.cancel()
            # Bounded: an app step that ignores cancellation must not hold its change set's shutdown for ever.
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                log.error(
                    "%s: dependent values update ignored cancellation for %.1fs; left behind",
                    self._name,
                    timeout,
                )

    async def _loop(self) -> None:
        failed_in_a_row = 0
        while not self._stopped:
            await self._permit.wait()
            if self._stopped:
                return
            # Clear before running: a notify() during the run sets the permit again -> exactly one more run.
            self._permit.clear()
            try:
                await self._run()
                self.runs += 1
                failed_in_a_row = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                # A DVU failure must not end the task, nor leave the update undone until the next request happens to
                # come: it is still due, so it runs again after a backoff (doubling, capped).
                self.failures += 1
                failed_in_a_row += 1
                delay = min(self._retry_backoff * 2 ** (failed_in_a_row - 1), self._retry_backoff_max)
                log.exception("%s: dependent values update failed; again in %.1fs", self._name, delay)
                await cancellation.sleep(delay)
                self._permit.set()
            if not self._permit.is_set():
                self._idle.set()
