"""The bookkeeping of an ordered push consumer, free of NATS: where it stands, when it needs a reset, and which
flow-control replies may go out.

JetStream numbers every delivery of a consumer (the *consumer sequence*, 1, 2, 3, ...). An ordered consumer takes
deliveries only in that order: a gap means a message was lost between server and client (a slow-consumer drop, a
cut connection), and the only safe repair is a new consumer that starts after the last stream sequence taken. The
server's idle heartbeats say which consumer sequence it last sent, so a loss at the tail is seen too, and silence
(no message and no heartbeat for two heartbeat periods) means the consumer itself is gone (a restarted server
loses memory-storage consumers).

:class:`Sequences` is that state; :class:`FlowReplies` holds the server's flow-control requests until the
messages sent before each one have been handled, which is what bounds the messages a slow change set buffers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

__all__ = ["FlowReplies", "Sequences"]

# Heartbeats that may be missed before the consumer counts as gone (as nats-py's ordered consumer counts them).
MISSED_HEARTBEATS = 2


class Sequences:
    """Where one ordered consumer stands: the consumer sequence it takes next, the last stream sequence taken."""

    __slots__ = ("expected", "last_seen", "last_stream_seq")

    def __init__(self, *, after: int = 0, now: float) -> None:
        self.expected = 1  # every consumer, and every consumer made by a reset, numbers its deliveries from 1
        self.last_stream_seq = after
        self.last_seen = (
            now  # when the server was last heard from on this consumer (a delivery or a heartbeat)
        )

    def take(self, consumer_seq: int, stream_seq: int, now: float) -> bool:
        """A delivery: True if it is the next in order (taken), False if one was skipped (reset)."""
        self.last_seen = now
        if consumer_seq != self.expected:
            return False
        self.expected += 1
        self.last_stream_seq = stream_seq
        return True

    def heartbeat(self, last_consumer_seq: int | None, now: float) -> bool:
        """An idle heartbeat naming the last consumer sequence sent: True if every delivery up to it was taken.

        Anything else needs a reset: a higher number is a delivery lost at the tail; a lower one means a delivery
        was taken that the server never sent (a forged one on our inbox): the stream is read again from the
        server's own count on."""
        self.last_seen = now
        return last_consumer_seq is None or last_consumer_seq == self.expected - 1

    def silent(self, now: float, heartbeat: float) -> bool:
        """Nothing heard for ``MISSED_HEARTBEATS`` heartbeat periods (and a little): the consumer is gone."""
        return now - self.last_seen > (MISSED_HEARTBEATS + 0.5) * heartbeat

    def restart(self, now: float) -> Sequences:
        """The state of the consumer that replaces this one: it starts after the last stream sequence taken."""
        return Sequences(after=self.last_stream_seq, now=now)


class FlowReplies:
    """Flow-control replies held until the deliveries received before them are handled.

    The server asks for a reply every so many bytes and stops sending once too many bytes are unanswered. Answering
    at once (as nats-py does for a subscription with a callback) tells it the messages were consumed when they
    were only queued; answering once they are handled keeps a slow change set's queue within the server's window.
    """

    __slots__ = ("_held", "handled", "received")

    def __init__(self) -> None:
        self.received = 0  # deliveries taken into the queue
        self.handled = 0  # deliveries handed to the handler and finished
        self._held: deque[tuple[int, str]] = deque()  # (deliveries received before it, reply subject)

    def request(self, reply: str) -> bool:
        """A flow-control request: True to answer it now, else it is held until its turn."""
        if self.handled >= self.received:
            return True
        self._held.append((self.received, reply))
        return False

    def holds(self, reply: str) -> bool:
        return any(held == reply for _, held in self._held)

    def done(self) -> Sequence[str]:
        """One delivery handled: the replies now due, in order."""
        self.handled += 1
        if not self._held:
            return ()
        due: list[str] = []
        while self._held and self._held[0][0] <= self.handled:
            due.append(self._held.popleft()[1])
        return due

    def forget(self) -> None:
        """Drop what is held (the consumer that asked was replaced and is deleted)."""
        self._held.clear()

    def __len__(self) -> int:
        return len(self._held)
