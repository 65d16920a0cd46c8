"""A subscription whose messages are handled as they are read, without a task and a queue in between.

nats-py hands each message of a callback subscription to a task of the subscription's own through a queue: a put,
a wake-up of that task at the next event-loop turn, a get, then the callback. For the replies that only resolve a
waiting future (JetStream acks, API answers, a request's reply) that hop is most of what a reply costs, and the
daemon and the client take two or three of them per request.

nats-py also has subscriptions that hand their message to a future (``subscribe(future=...)``, what its old-style
requests use): it calls the future's ``set_result`` from its read loop, for every message. :func:`subscribe_inline`
passes an object that answers like a future and calls ``handler`` there. So ``handler`` must be quick and must not
wait: it runs inside nats-py's read loop. An exception it raises is logged and dropped, never let into that loop.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

__all__ = ["subscribe_inline"]

log = logging.getLogger(__name__)


class _Sink:
    """What nats-py asks of a subscription's future: ``cancelled()``, then ``set_result(msg)`` per message."""

    __slots__ = ("_handler",)

    def __init__(self, handler: Callable[[Msg], None]) -> None:
        self._handler = handler

    def __bool__(self) -> bool:
        return True  # nats-py tests the future's truth before using it

    def cancelled(self) -> bool:
        return False

    def set_result(self, msg: Msg) -> None:
        try:
            self._handler(msg)
        except Exception:
            log.exception("handling a message on %s failed", msg.subject)


def _supported() -> bool:
    return "future" in inspect.signature(NatsClient.subscribe).parameters


_SUPPORTED = _supported()


async def subscribe_inline(
    nc: NatsClient, subject: str, handler: Callable[[Msg], None], *, queue: str = ""
) -> Any:
    """Subscribe ``subject`` (in the queue group ``queue``, if given), ``handler(msg)`` called for each message as
    nats-py reads it (see the module docstring). Returns nats-py's subscription (``unsubscribe()`` it as any other)."""
    if not _SUPPORTED:  # a nats-py without the hook: an ordinary callback subscription, one hop later

        async def callback(msg: Msg) -> None:
            handler(msg)

        return await nc.subscribe(subject, queue=queue, cb=callback)
    return await nc.subscribe(subject, queue=queue, future=_Sink(handler))  # type: ignore[arg-type]
