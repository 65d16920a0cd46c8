"""One loop per daemon that renews the lease of every owned change set and watches their steps.

Why one loop and not a keep-alive task per change set: a confirmed progress ack through nats-py's request (a fresh
reply token, a future, a timeout timer) every ``progress_period`` per change set is, with a thousand change sets
owned, two thousand requests and wake-ups a second, a large share of a daemon's CPU. So one task sends every
renewal as a plain publish whose reply subject names it (``<inbox>.<n>``), and one subscription takes the
confirmations. The rules of ``lease.py`` do not change: a renewal counts only if its confirmation arrives while the
lease is still held, and then extends it from the *send* time of the renewal confirmed before it.

The same loop is the watchdog: it wakes at least every ``progress_period``, and sooner when a lease is about to run
out, and asks each watched change set to check its lease and its running step (``Watched.watch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_core.nats.inline_subscription import subscribe_inline
from rebaser_server.task.lease import Lease

__all__ = ["LeaseKeeper", "Watched"]

log = logging.getLogger(__name__)

_PROGRESS = b"+WPI"
_STATUS = "Status"
# The loop never wakes more often than this, however close a lease is to running out.
_MIN_PAUSE = 0.005


class Watched(Protocol):
    lease: Lease

    def watch(self, now: float) -> bool:
        """Check lease and steps; False once the change set needs no more renewals (it is finishing)."""
        ...


class LeaseKeeper:
    def __init__(
        self,
        nc: NatsClient,
        *,
        period: float,
        renew_every: float | None = None,
        watch_every: float | None = None,
        urgent: Callable[[], bool] | None = None,
        on_renewed: Any = None,
    ) -> None:
        self._nc = nc
        self._period = period
        # Each lease is renewed on the first pass at least this long after its last renewal, less half a period (so
        # on the pass nearest the due time): every pass with lease_mode task, every quarter of the tasks consumer's
        # ack_wait with lease_mode daemon (liveness.py).
        self._renew_after = (period if renew_every is None else renew_every) - 0.5 * period
        # Each change set is watched on every pass, or (lease_mode daemon, where a task's own lease is long and the
        # heartbeat bounds them all) every ``watch_every``, unless ``urgent()`` says every pass counts now (the
        # heartbeat lapsed, others wait for a slot): thousands of idle change sets cost a pass each less often.
        self._watch_after = 0.0 if watch_every is None else watch_every - 0.5 * period
        self._urgent = urgent
        self._last_watched: dict[int, float] = {}
        self._on_renewed = on_renewed  # called once per confirmed renewal (the daemon's counter)
        self._inbox = nc.new_inbox()
        self._watched: dict[int, Watched] = {}
        self._last_sent: dict[int, float] = {}
        self._sent: dict[str, tuple[Lease, float]] = {}  # renewal token -> (lease, monotonic send time)
        self._next = 0
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._wake_at = 0.0  # monotonic time the loop wakes next by itself

    async def start(self) -> None:
        self._sub = await subscribe_inline(self._nc, f"{self._inbox}.*", self._on_confirmed)
        self._task = asyncio.create_task(self._run(), name="rebaser lease keeper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def watching(self) -> int:
        """Change sets whose lease this keeper renews now."""
        return len(self._watched)

    def add(self, watched: Watched) -> None:
        """Watch ``watched``; its lease is renewed on the loop's next pass (then every ``progress_period``).

        Not at once: a lease starts with the delivery's whole ``ack_wait`` (see lease.py), more than a period, and
        a change set that lets go before the next pass (a burst of one-request change sets) needs no renewal."""
        self._watched[id(watched)] = watched
        # Woken early only if this lease may run out before the loop's next wake (a task that waited in a buffer).
        # Waking it for every new change set would make each activation a pass over every watched one: quadratic
        # under a burst of activations.
        if watched.lease.remaining() < self._wake_at - time.monotonic() + self._period:
            self._wake.set()

    def remove(self, watched: Watched) -> None:
        self._watched.pop(id(watched), None)
        self._last_sent.pop(id(watched), None)
        self._last_watched.pop(id(watched), None)

    async def _run(self) -> None:
        while True:
            now = time.monotonic()
            pause = self._pause(now)
            self._wake_at = now + pause
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._wake.wait()
            self._wake.clear()
            try:
                # Until the pass is over, a lease added meanwhile wakes the loop again (add()): the next wake is not
                # known before this pass ends, and a pass can wait (a publish that must flush first).
                self._wake_at = math.inf
                await self._tick(time.monotonic())
            except Exception:
                log.exception("lease keeper tick failed")

    def _pause(self, now: float) -> float:
        """One period, or less if a lease runs out sooner (its watcher must notice at once). Every lease is renewed
        on the same tick, so the loop wakes once per period however many change sets it keeps."""
        remaining = min((w.lease.remaining() for w in self._watched.values()), default=self._period)
        return max(_MIN_PAUSE, min(self._period, remaining))

    async def _tick(self, now: float) -> None:
        # Renewals never confirmed (lost, or the server is slow) are forgotten once they could no longer count.
        stale = [
            token for token, (lease, sent) in self._sent.items() if lease.remaining() <= 0 or now - sent > 60
        ]
        for token in stale:
            del self._sent[token]
        every = self._watch_after <= 0 or (self._urgent is not None and self._urgent())
        for key, watched in list(self._watched.items()):
            if every or now - self._last_watched.get(key, -math.inf) >= self._watch_after:
                self._last_watched[key] = now
                if not watched.watch(now):
                    self.remove(watched)
                    continue
            if now - self._last_sent.get(key, -math.inf) >= self._renew_after:  # new ones have none
                await self._renew(watched, now)

    async def _renew(self, watched: Watched, now: float) -> None:
        lease = watched.lease
        self._last_sent[id(watched)] = now
        if not self._nc.is_connected or lease.remaining() <= 0:
            return  # a publish now would wait in the reconnect buffer; a lost lease is not renewed
        self._next += 1
        token = str(self._next)
        self._sent[token] = (lease, now)
        try:
            await self._nc.publish(lease.reply_subject, _PROGRESS, reply=f"{self._inbox}.{token}")
        except Exception as err:
            self._sent.pop(token, None)
            log.debug("lease renewal not sent: %r", err)

    def _on_confirmed(self, msg: Msg) -> None:
        entry = self._sent.pop(msg.subject.rsplit(".", 1)[-1], None)
        if entry is None or (msg.headers and _STATUS in msg.headers):
            return  # unknown, or a status (503: no responders, the consumer is gone) rather than the server's ack
        lease, sent = entry
        if lease.confirmed(sent) and self._on_renewed is not None:
            self._on_renewed()
