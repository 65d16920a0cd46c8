"""The bookkeeping of an ordered push consumer, free of NATS: where it stands, when it needs a reset, and which
flow-control replies may go out.

JetStream numbers every delivery of a consumer (the *consumer sequence*, 1, 2, 3, ...). An ordered consumer takes
deliveries only in that order: a gap means a message was lost between server and client (a slow-consumer drop, a
cut connection), and the only safe repair is a new consumer that starts after the last stream sequence taken. The
server's idle heartbeats say which consumer sequence it last sent, so a loss at the tail is seen too, and silence
(no message and no heartbeat for more than two heartbeat periods) means the consumer itself is gone (a restarted
server loses memory-storage consumers).

:class:`Sequences` is that state; :class:`FlowReplies` holds the server's flow-control request until the
messages sent before it have been handled, which is what bounds the messages a slow change set buffers.
"""

from __future__ import annotations

__all__ = ["GAP", "STALE", "TAKEN", "FlowReplies", "Sequences"]

# Heartbeats that may be missed before the consumer counts as gone (as nats-py's ordered consumer counts them).
MISSED_HEARTBEATS = 2

# What Sequences.take makes of a delivery.
TAKEN = 0  # the next in order: handle it
GAP = 1  # one was skipped (lost on the way): replace the consumer
STALE = 2  # the next consumer sequence but not a later stream sequence: not the server's; drop it


class Sequences:
    """Where one ordered consumer stands: the consumer sequence it takes next, the last stream sequence taken."""

    __slots__ = ("expected", "last_seen", "last_stream_seq")

    def __init__(self, *, after: int = 0, now: float) -> None:
        self.expected = 1  # every consumer, and every consumer made by a reset, numbers its deliveries from 1
        self.last_stream_seq = after
        self.last_seen = now  # when the server was last heard from (a delivery or a heartbeat)

    def take(self, consumer_seq: int, stream_seq: int, now: float) -> int:
        """A delivery: ``TAKEN``, ``GAP`` or ``STALE``.

        An ordered consumer's stream sequences only grow: one at or below the last taken is a replay or a forgery,
        never a delivery to apply (applying it could move the restart point backwards, or past requests not yet
        read). It is dropped without a reset, so it cannot trigger one either."""
        self.last_seen = now
        if consumer_seq != self.expected:
            return GAP
        if stream_seq <= self.last_stream_seq:
            return STALE
        self.expected += 1
        self.last_stream_seq = stream_seq
        return TAKEN

    def heartbeat(self, last_consumer_seq: int | None, now: float) -> bool:
        """An idle heartbeat naming the last consumer sequence sent: True if every delivery up to it was taken.

        A higher number is a delivery lost at the tail, and needs a reset. (A lower one cannot come from the
        server, which sends a consumer's deliveries and heartbeats in order on one connection; it resets too.)"""
        self.last_seen = now
        return last_consumer_seq is None or last_consumer_seq == self.expected - 1

    def silent(self, now: float, heartbeat: float) -> bool:
        """Nothing heard for more than ``MISSED_HEARTBEATS`` heartbeat periods (half a period more, for a busy
        event loop): the consumer is gone."""
        return now - self.last_seen > (MISSED_HEARTBEATS + 0.5) * heartbeat

    def restart(self, now: float) -> Sequences:
        """The state of the consumer that replaces this one: it starts after the last stream sequence taken."""
        return Sequences(after=self.last_stream_seq, now=now)


class FlowReplies:
    """The flow-control reply held until the deliveries received before it are handled.

    The server asks for a reply every so many bytes and stops sending once too many bytes are unanswered. Answering
    at once (as nats-py does for a subscription with a callback) tells it the messages were consumed when they
    were only queued; answering once they are handled keeps a slow change set's queue within the server's window.
    The server has one request outstanding per consumer, so one is held: a newer request replaces it (and however
    many forged requests come, what is held stays one).
    """

    __slots__ = ("_after", "_held", "handled", "received")

    def __init__(self) -> None:
        self.received = 0  # deliveries taken into the queue
        self.handled = 0  # deliveries handed to the handler and finished
        self._held: str | None = None  # the reply subject held ...
        self._after = 0  # ... until this many deliveries are handled

    def request(self, reply: str) -> bool:
        """A flow-control request: True to answer it now, else it is held until its turn."""
        if self.handled >= self.received:
            return True
        self._held, self._after = reply, self.received
        return False

    def holds(self, reply: str) -> bool:
        return self._held == reply

    def done(self) -> str | None:
        """One delivery handled: the reply now due, if one is."""
        self.handled += 1
        if self._held is None or self._after > self.handled:
            return None
        reply, self._held = self._held, None
        return reply

    def forget(self) -> None:
        """Drop what is held (the consumer that asked was replaced and is deleted)."""
        self._held = None

    def __len__(self) -> int:
        return 0 if self._held is None else 1
