"""Admission: how many owned change sets may be in their cold path at once, and waiting for a slot.

A change set taken on is *starting* until its first request is delivered (or it has nothing queued): its record
is read and bumped, its consumer created. At most ``start_concurrency`` start at once. A daemon that pulls every
task a burst offers starts thousands at once: each of their round trips queues behind all the others', lease
confirmations come back after the leases have run out, and whole pull batches are redelivered and taken again. A
task not yet pulled waits in the server, where its lease has not started.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Hashable
from typing import TypeVar

from rebaser_core.settings import Settings

__all__ = ["Admission"]

K = TypeVar("K")

# While every slot is taken, how often the daemon looks whether other change sets wait for an owner.
PRESSURE_CHECK = 1.0


class Admission:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        # Change sets taken but not yet started: each one's processor, and when it was taken (monotonic).
        self._starting: dict[Hashable, float] = {}
        # Set when a change set lets go or has started: the pull loop may have room again.
        self._freed = asyncio.Event()
        self._woken = False  # wake(): the daemon stops, no wait waits any more
        # Slots the lanes intake's running turns may still fill, over every served shard (lane_intake.py).
        self.reserved = 0

    @property
    def starting(self) -> int:
        """Change sets still in their cold path."""
        return len(self._starting)

    def starting_by(self, key: Callable[[Hashable], K]) -> Counter[K]:
        """The change sets in their cold path counted by ``key`` (their workspace, say)."""
        return Counter(key(processor) for processor in self._starting)

    def taken(self, processor: Hashable) -> None:
        self._starting[processor] = time.monotonic()

    def started(self, processor: Hashable) -> None:
        """``processor`` is past its cold path (or ended before it got there): one more may be taken on."""
        self._starting.pop(processor, None)
        self._freed.set()

    def wake(self) -> None:
        """Wake a pull loop waiting for a slot, and every later wait at once (shutdown)."""
        self._woken = True
        self._freed.set()

    def room(self) -> int:
        """How many more change sets may start now. One starting for longer than ``ack_wait`` counts as started:
        whatever holds its first request back (a consumer that never delivers) must not hold admission for ever."""
        settings = self._settings
        if len(self._starting) >= settings.start_concurrency:
            too_old = time.monotonic() - settings.ack_wait
            for processor in [p for p, since in self._starting.items() if since < too_old]:
                del self._starting[processor]
        return settings.start_concurrency - len(self._starting)

    async def wait(self) -> bool:
        """Until a change set lets go or starts (True), or ``PRESSURE_CHECK`` passes (False).

        One that let go or started since the last wait counts: the caller then looks again. Cleared here, before
        waiting, a release between the caller's look and this wait was lost, and the loop waited the whole second
        (so did a shutdown: the wake it asked came just before)."""
        if not self._freed.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PRESSURE_CHECK):
                    await self._freed.wait()
        freed = self._freed.is_set()
        if not self._woken:
            self._freed.clear()
        return freed
