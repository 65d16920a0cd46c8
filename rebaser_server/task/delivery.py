"""What a request delivery's reply subject says about it, read without nats-py's ``Msg.metadata``.

JetStream names each delivery in its reply (ack) subject: ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.
<consumer seq>.<stored ns>.<pending>``, with a domain and an account hash after ``ACK`` in the newer form. nats-py's
``Msg.metadata`` reads it into two frozen dataclasses and a ``datetime``; each request's handling needs four
numbers of it (its stream and consumer sequences, how many requests wait behind it, when it was stored), and
building nats-py's objects costs 3 % of a daemon's time per request. This reads the same tokens as nats-py 2.16
(``Msg.Metadata._from_reply``): the same forms, ``NotJSMessageError`` for any other, ``ValueError`` where a number
is not one. It does not build the ``datetime`` nats-py makes of the stored-at time, so a time beyond year 9999,
which nats-py refuses (``OSError``), is taken as it is (only the queue-wait metric reads it).
"""

from __future__ import annotations

from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

__all__ = ["Delivery"]

# Tokens of the two forms, as nats-py counts them: 9 without a domain; 12 with one (11 accepted: the random token at
# the end is optional).
_V1_TOKENS = 9
_V2_MIN_TOKENS = 11
# Index of the first number (delivered count; then stream and consumer sequence, stored at, pending) in each form.
_V1_NUMBERS = 4
_V2_NUMBERS = 6


class Delivery:
    """One JetStream delivery: ``stream_seq``, ``num_pending`` (messages of the consumer still to deliver after
    it), ``stored_ns`` (when the stream stored the message, nanoseconds since the epoch, server clock) and
    ``consumer_seq`` (the consumer's count of its deliveries: an ordered consumer's gap detector)."""

    __slots__ = ("consumer_seq", "delivered", "num_pending", "stored_ns", "stream_seq")

    def __init__(
        self, stream_seq: int, num_pending: int, stored_ns: int, delivered: int, consumer_seq: int
    ) -> None:
        self.stream_seq = stream_seq
        self.num_pending = num_pending
        self.stored_ns = stored_ns
        self.delivered = delivered  # which delivery of the message this is (1: the first)
        self.consumer_seq = consumer_seq

    @classmethod
    def of(cls, msg: Msg) -> Delivery:
        """Read ``msg``'s reply subject; raises ``NotJSMessageError`` if it is not a JetStream delivery's."""
        return cls.parse(msg.reply)

    @classmethod
    def parse(cls, reply: str | None) -> Delivery:
        if not reply:
            raise NotJSMessageError
        tokens = reply.split(".")
        first = _first_number(tokens)
        if first is None or tokens[0] != "$JS" or tokens[1] != "ACK":
            raise NotJSMessageError
        # int() of all five, as nats-py does (ValueError): a subject with words where numbers belong is refused.
        delivered, stream_seq, consumer_seq, stored, pending = map(int, tokens[first : first + 5])
        return cls(stream_seq, pending, stored, delivered, consumer_seq)

    @staticmethod
    def names(reply: str) -> tuple[str, str] | None:
        """The stream and consumer a delivery subject names (the two tokens before its numbers), or None if it is
        of neither form."""
        tokens = reply.split(".")
        first = _first_number(tokens)
        return None if first is None else (tokens[first - 2], tokens[first - 1])

    @property
    def stored_at(self) -> float:
        """When the stream stored the message, seconds since the epoch (server clock)."""
        return self.stored_ns / 1e9

    def __repr__(self) -> str:
        return (
            f"Delivery(stream_seq={self.stream_seq}, num_pending={self.num_pending}, stored_ns={self.stored_ns}, "
            f"delivered={self.delivered}, consumer_seq={self.consumer_seq})"
        )


def _first_number(tokens: list[str]) -> int | None:
    """Where the numbers start in a delivery subject's tokens, by its form; None if it is of neither."""
    count = len(tokens)
    if count == _V1_TOKENS:
        return _V1_NUMBERS
    if count >= _V2_MIN_TOKENS:
        return _V2_NUMBERS
    return None
