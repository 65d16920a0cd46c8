"""Handing a task back (nack) so that the hand-back is stored by nats-server and confirmed.

A plain ``-NAK`` only puts the message on the consumer's in-memory redelivery queue; the consumer's stored state
still says "delivered, awaiting ack". When nats-server restarts before it redelivers (the embedded server stops
right after its daemon hands back on SIGTERM), the hand-back is lost and the task comes back only once ack_wait
has passed since the last progress ack: every change set the daemon owned would stall for ~25 s after a restart.
A nack *with a delay* rewrites the stored pending entry instead, so it survives the restart; a millisecond costs
nothing. Asking for the server's confirmation ("ack the ack") means that once this returns, the hand-back is done,
whatever stops next: flushing the connection only proves that the server has read it, not that the consumer has
processed it.
"""

from __future__ import annotations

import json

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

__all__ = ["HANDBACK_TIMEOUT", "hand_back", "nak_payload"]

# Any positive delay is stored; this one is too short to matter.
_MIN_DELAY = 0.001
# The server confirms a nack at once; this only bounds a shutdown against an unresponsive server.
HANDBACK_TIMEOUT = 5.0


async def hand_back(
    nc: NatsClient, msg: Msg, delay: float | None = None, *, timeout: float = HANDBACK_TIMEOUT
) -> None:
    """Nack ``msg`` for redelivery after ``delay`` seconds (None: at once), and wait for the server's confirmation.

    Raises what ``nc.request`` raises (a timeout, a closed connection); the nack may still have been applied.
    """
    await nc.request(msg.reply, nak_payload(delay), timeout=timeout)


def nak_payload(delay: float | None = None) -> bytes:
    """The ``-NAK`` for redelivery after ``delay`` seconds (None: at once), stored by the server (see above)."""
    nanos = int(max(delay or 0.0, _MIN_DELAY) * 1e9)
    return b"-NAK " + json.dumps({"delay": nanos}).encode()
