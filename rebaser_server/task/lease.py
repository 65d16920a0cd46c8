"""A daemon's hold on one task delivery: for how long it can be *sure* nobody else holds the change set.

JetStream redelivers an unacked task ``ack_wait`` after the last progress ack it received, and it honours a late
ack or nak from an older delivery (it would take the task from its new holder). Holding a message is therefore no
proof of ownership; time is. Two facts bound it from below, both measured on this process's monotonic clock
(which keeps running while the process is paused, so a SIGSTOP or a long GC pause counts against the lease):

- **Delivery.** The task was delivered in answer to a pull request sent no earlier than ``since``, so the server
  cannot redeliver it before ``since + ack_wait``.
- **Renewal.** A progress ack (``+WPI``) sent with a reply subject is answered by the server once it was applied
  (by the consumer's leader). One sent at ``t`` and answered while the lease still held proves that leader's timer
  restarted no earlier than ``t``. (nats-py's ``in_progress()`` is fire-and-forget, which proves nothing.) The daemon's
  :class:`~rebaser_server.task.keeper.LeaseKeeper` sends them.
- **But a confirmed renewal can still be lost.** A replicated consumer's leader answers a progress ack as soon as
  it has *proposed* the new timer to its followers, not once they hold it (nats-server ``consumer.go``:
  ``processAck`` calls ``progressUpdate``, then ``sendAckReply``). If that leader steps down (or dies) just then,
  the new leader has the timer of the renewal before, and looks at its pending tasks 0.5-1.5 s after its election:
  it redelivers as if the last renewal had never been sent. The leader step-down chaos run provokes it (a task
  redelivered while its owner, holding a lease from a confirmed renewal, still applies) and
  ``bench/progress_ack_probe.py`` measures it: with the step-down sent right behind the progress ack, about half of
  the confirmed renewals are lost; sent 0.3 s after the confirmation, none. So a confirmation extends the
  lease from the *previous* confirmed renewal's send time (the delivery's, for the first one): that renewal was
  confirmed a period or more earlier, time enough to be replicated. A single leader change loses at most the
  proposals of its last moments, at most one renewal per lease.

The lease is *held* while that bound, less a ``margin``, lies in the future. The margin covers what happens after
the check: an ack or nak in flight, a step that must be cancelled. A daemon applies nothing, and never acks or naks
the delivery, unless the lease is held: a paused, partitioned or slow daemon stops on its own, and its late ack can
no longer take the task from the daemon that took over.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_core.nats.requester import Requester
from rebaser_server.task.handback import nak_payload
from rebaser_server.task.heartbeat import Heartbeat

__all__ = ["Lease"]

_SETTLE_AGAIN_AFTER = (
    0.25  # between an unconfirmed ack or nack and the next (a leader election takes a second or two)
)
_SETTLE_FOR = 10.0  # the longest an ack or nack is sent again (several elections' worth)


class Lease:
    def __init__(
        self,
        nc: NatsClient,
        msg: Msg,
        *,
        ack_wait: float,
        margin: float,
        since: float,
        requester: Requester | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self._nc = nc
        self._requester = requester  # the daemon's light request-reply, for the confirmed ack or nak
        self._msg = msg
        self._ack_wait = ack_wait
        self._margin = margin
        self._expires = since + ack_wait  # monotonic: the earliest the server may redeliver the task
        # Send time of the last confirmed renewal (the pull's, before the first): the next confirmation extends the
        # lease from here, not from its own send time (see the module docstring).
        self._last_confirmed = since
        self.renewals = 0
        # lease_mode daemon: also bounded by the daemon's heartbeat, in the generation it is taken under (heartbeat.py).
        self._heartbeat = heartbeat
        self._generation = heartbeat.generation if heartbeat is not None else 0

    def remaining(self) -> float:
        """Seconds the lease is still held (negative once lost)."""
        return self.deadline() - time.monotonic()

    def deadline(self) -> float:
        """The monotonic time the lease is held until (already past once lost)."""
        own = self._expires - self._margin
        heartbeat = self._heartbeat
        if heartbeat is None:
            return own
        if heartbeat.generation != self._generation:
            return time.monotonic() - 1.0  # taken before a lapse: lost for good
        return min(own, heartbeat.deadline())

    def held(self) -> bool:
        return self.remaining() > 0 and bool(self._nc.is_connected)

    @property
    def reply_subject(self) -> str:
        """Where progress acks, acks and nacks of this delivery go."""
        return str(self._msg.reply)

    def confirmed(self, sent: float) -> bool:
        """The server answered a progress ack sent at ``sent`` (monotonic), and the lease is still held now: extend
        it from the renewal confirmed before this one, which by now the server's followers hold too (a consumer
        leader change may lose this one: see the module docstring). A confirmation that arrives after the lease ran
        out proves nothing (the server may have redelivered the task before it applied the progress ack). The
        sending is ``keeper.py``'s."""
        if self._expires - self._margin - time.monotonic() <= 0:
            return False
        self._expires = max(self._expires, min(self._last_confirmed, sent) + self._ack_wait)
        self._last_confirmed = max(self._last_confirmed, sent)
        self.renewals += 1
        return True

    async def ack(self, timeout: float) -> bool:
        """Ack (confirmed) if the lease is held, asked again while it holds; False if it was not confirmed."""
        return await self._settle_confirmed(b"+ACK", timeout)

    async def nak(self, delay: float | None = None) -> bool:
        """Hand the task back (redelivered after ``delay``) if the lease is held, asked again while it holds."""
        return await self._settle_confirmed(nak_payload(delay), 5.0)

    async def _settle_confirmed(self, payload: bytes, timeout: float) -> bool:
        """Send ``payload`` until the server confirms it, while the lease holds. An ack or nack lost with a NATS
        node (or its answer lost) would leave the task to the consumer's ``ack_wait`` (``task_ack_wait`` in
        lease_mode daemon: 60 s), and new requests of the change set without a task until then. Sending it again is
        safe while the lease holds: the server has not redelivered the task, and it answers an ack of a task it
        already removed (nats-server ``processAckMsg`` replicates it again). For at most ``_SETTLE_FOR`` seconds:
        a JetStream that stays unanswering is the consumer's ``ack_wait``'s to settle, not a slot's to wait for."""
        give_up = time.monotonic() + _SETTLE_FOR
        while True:
            if await self._settle(payload, max(0.001, min(self.remaining(), timeout))):
                return True
            if not self.held() or time.monotonic() >= give_up:
                return False
            await asyncio.sleep(min(_SETTLE_AGAIN_AFTER, max(self.remaining(), 0.0)))

    async def hand_back_after_lapse(self, claim: Callable[[], Awaitable[bool | None]] | None = None) -> bool:
        """``lease_mode`` daemon: hand back (nack, at once) a task given up because the daemon's heartbeat lapsed,
        while the delivery itself is still held. Without it the task waits for the tasks consumer's long
        ``task_ack_wait``: a lapse shorter than ``ack_wait`` (a freeze, a slow heartbeat put) lets no peer reap it.

        Safe although the heartbeat no longer covers the task: the server has not redelivered it (the delivery's own
        lease holds), so the nack takes it from nobody. A peer may be reaping this daemon at the same time: it marks
        the record, deletes this task message and publishes a fresh one, and a nack between its mark and its delete
        would let another daemon take this message while a third takes the fresh one (found by the freezes battery:
        two daemons applying one change set at once, the first fenced only at its commit). ``claim`` (the change
        set's record, when this owner wrote one: ``ChangeSetHandle.claim_after_lapse``) settles who hands it back:
        True, this daemon; False, the peer; None, not known yet. The change set's steps have stopped before this
        is called."""
        if self._heartbeat is None or self._heartbeat.covers(self._generation):
            return False
        claimed = claim is None
        # Tried again while the delivery's own lease holds: the lapse often comes with the cluster's trouble (a node
        # killed, the heartbeat bucket without a leader), when the first nak fails too; given up, the task would
        # wait out that lease (task_ack_wait) after the cluster is back.
        while (own := self._expires - self._margin - time.monotonic()) > 0:
            if self._nc.is_connected:
                if not claimed:
                    assert claim is not None
                    verdict = await claim()
                    if verdict is False:
                        return False  # a peer reaped it: the fresh task it published is the change set's
                    claimed = verdict is True
                if claimed and await self._send(nak_payload(None), min(own, 5.0)):
                    return True
            await asyncio.sleep(min(_SETTLE_AGAIN_AFTER, max(own, 0.0)))
        return False

    async def term(self) -> bool:
        """Remove the task for good (it can have no work) if the lease is held."""
        return await self._settle(b"+TERM", max(0.001, min(self.remaining(), 5.0)))

    async def _settle(self, payload: bytes, timeout: float) -> bool:
        if not self.held():
            return False
        return await self._send(payload, min(timeout, self.remaining()))

    async def _send(self, payload: bytes, timeout: float) -> bool:
        """Send an ack, nack or term of the delivery; True once the server confirmed it."""
        with contextlib.suppress(TimeoutError, nats.errors.Error):
            if self._requester is not None:
                await self._requester.request(self._msg.reply, payload, timeout=timeout)
            else:
                await self._nc.request(self._msg.reply, payload, timeout=timeout)
            return True
        return False
