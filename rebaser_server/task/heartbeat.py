"""``lease_mode`` daemon: one heartbeat per daemon instead of a renewal per owned change set every period.

With ``lease_mode`` task, each owned change set's lease is its own task delivery, renewed every ``progress_period``
so that a dead daemon's change sets stall at most ``ack_wait``: two confirmed progress acks a second per change set,
idle or not. With ``lease_mode`` daemon the tasks consumer's ``ack_wait`` is the long ``task_ack_wait`` (each task
renewed every quarter of it), and what bounds the stall is this daemon's **heartbeat**: a key of its own in the
daemons bucket, put every ``progress_period``. A daemon whose key has not changed for ``ack_wait`` is dead to its
peers, which hand its tasks back (rebaser_server.daemon.liveness). So the daemon's hold on *every* task is also bounded
by its heartbeat:

- **A confirmed put proves the key was written no earlier than its send time.** A peer declares the daemon dead
  only once the key's revision it received has stayed the latest for ``ack_wait`` on its own clock (checked with a
  read of the key at the end), and it received that revision after the put was stored. So the heartbeat holds until
  the last confirmed put's send time plus ``ack_wait``, less the margin for what is in flight, and a peer acts after
  that. A put of a replicated bucket is confirmed once a quorum stored it: unlike a progress ack (lease.py), a new
  leader cannot lose it.
- **Once lapsed, never again for what was held.** A confirmation that arrives after the heartbeat lapsed starts a
  new *generation*: a peer may have handed back every task held before, so each lease (lease.py) holds only with
  the generation it was taken under.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time

from nats.js.kv import KeyValue

from rebaser_core.nats import cancellation

__all__ = ["Heartbeat", "heartbeat_key"]

log = logging.getLogger(__name__)


def heartbeat_key(owner: str) -> str:
    """The daemon's key in the daemons bucket: its owner name made a valid key (``host:pid:id`` -> ``host_pid_id``)."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in owner)


class Heartbeat:
    def __init__(self, owner: str, *, ack_wait: float, margin: float, period: float) -> None:
        self._kv: KeyValue | None = None  # the daemons bucket, given to start()
        self._owner = owner
        self.key = heartbeat_key(owner)
        self._ack_wait = ack_wait
        self._margin = margin
        self._period = period
        self._expires = -math.inf  # monotonic: when the heartbeat lapses (never held yet)
        self.generation = 0
        self.beats = 0
        self._held = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def remaining(self) -> float:
        """Seconds the heartbeat still holds (negative once lapsed)."""
        return self.deadline() - time.monotonic()

    def deadline(self) -> float:
        """The monotonic time the heartbeat holds until."""
        return self._expires - self._margin

    def held(self) -> bool:
        return self.remaining() > 0

    def covers(self, generation: int) -> bool:
        """Whether a lease taken under ``generation`` is still covered: the heartbeat held ever since."""
        return generation == self.generation and self.held()

    def confirmed(self, sent: float) -> None:
        """A put sent at ``sent`` (monotonic) was confirmed now."""
        if not self.held():
            self.generation += 1  # lapsed (or never held): whatever was held before is gone
            self._expires = sent + self._ack_wait
            if self.generation > 1:
                log.warning("heartbeat lapsed and is back: every change set held before is let go")
        else:
            self._expires = max(self._expires, sent + self._ack_wait)
        self.beats += 1
        self._held.set()

    async def start(self, kv: KeyValue, timeout: float) -> None:
        """Beat once (the daemon takes no task before), then every period in the background. Raises TimeoutError
        if no beat is confirmed within ``timeout``; may be called again then (it beats on in the background)."""
        self._kv = kv
        await self._beat()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="rebaser heartbeat")
        async with asyncio.timeout(timeout):
            await self._held.wait()

    async def stop(self, *, delete: bool) -> None:
        """Stop beating; ``delete``: remove the key (a clean stop: peers have nothing of this daemon's to hand back)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
        if delete and self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(self.key)

    async def _run(self) -> None:
        while True:
            await cancellation.sleep(self._period)
            await self._beat()

    async def _beat(self) -> None:
        assert self._kv is not None
        sent = time.monotonic()
        value = json.dumps({"owner": self._owner}).encode()
        try:
            # A confirmation later than ack_wait proves nothing more than a lapse: wait no longer than that.
            async with asyncio.timeout(self._ack_wait):
                await self._kv.put(self.key, value)
        except Exception as err:
            log.debug("heartbeat not confirmed: %r", err)
            return
        self.confirmed(sent)
