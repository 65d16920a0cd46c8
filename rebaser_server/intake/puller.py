"""Pulling tasks from the shared tasks consumer in batches, each task handed out the moment it arrives.

nats-py's ``fetch(batch > 1)`` returns only once the whole batch arrived or the pull expired, which would stall newly
active change sets (docs/design.md §6); and one task per round trip makes the pull loop itself the queue under a
burst of new change sets (every activation waits for its own round trip behind the others). So one pull request
asks for up to ``batch`` tasks and every delivery is yielded as it comes; the
pull ends when the batch is complete or the server says it expired (a status message), and the next one goes out.

Each pull request has a reply subject, and a subscription, of its own. A delivery carries the task's own subject,
not the reply subject, so the subscription that received it is what tells which pull it answers; that pull's send
time is the lease's lower bound (the server cannot have delivered a task before it was asked for it, see
``lease.py``): exact, even for a delivery that arrives after its pull was given up locally.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

__all__ = ["NoConsumer", "PullRefused", "TaskPuller"]

# Pulls given up locally (no status message in time) keep their subscription for late deliveries; at most this
# many. A delivery to a pull no longer listened to is redelivered after ack_wait, like any unacked task.
_LINGERING_PULLS = 8
# After a pull's expiry the server's status message should arrive promptly; wait this much longer, then move on.
_STATUS_GRACE = 1.0
_STATUS = "Status"

# (delivery or None for "this pull has ended", the pull's send time, the pull's number, why it ended)
_Item = tuple[Msg | None, float, int, str]
# A pull that simply expired, was fulfilled, or (no_wait) found nothing more: anything else (409 consumer deleted,
# 503 no consumer or no JetStream) is trouble.
_ENDED = ("408", "complete", "404")


class PullRefused(Exception):
    """The server refused or ended a pull with a status other than an expiry (consumer deleted, no JetStream)."""


class NoConsumer(PullRefused):
    """Nobody answered the pull (status 503): the consumer does not exist (or JetStream is not there)."""


class TaskPuller:
    def __init__(self, nc: NatsClient, stream: str, consumer: str, *, expires: float) -> None:
        self._nc = nc
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._inbox = nc.new_inbox()
        self._expires = expires
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._pulls = 0
        self._lingering: OrderedDict[int, Any] = OrderedDict()  # pull number -> subscription, oldest first

    async def stop(self) -> None:
        while self._lingering:
            _, sub = self._lingering.popitem(last=False)
            await sub.unsubscribe()

    def leftovers(self) -> list[Msg]:
        """Deliveries received but not handed out (to hand back at shutdown)."""
        msgs = []
        while not self._queue.empty():
            msg, _, _, _ = self._queue.get_nowait()
            if msg is not None:
                msgs.append(msg)
        return msgs

    async def pull(
        self, batch: int, *, no_wait: bool = False, expires: float | None = None
    ) -> AsyncIterator[tuple[Msg, float]]:
        """Send one pull request for up to ``batch`` tasks; yield ``(task, pulled_at)`` as each arrives, until the
        batch is complete or the pull expired (``no_wait``: until what is there now was delivered; ``no_wait`` with
        ``expires``: the same, but if nothing is there the server waits up to ``expires`` for the first).
        ``pulled_at`` is the monotonic send time of the pull the task answers (a late delivery of an earlier pull
        carries that pull's time)."""
        wait_first = no_wait and expires is not None  # no_wait with expires: see the docstring
        expires = self._expires if expires is None else expires
        self._pulls += 1
        number, sent = self._pulls, time.monotonic()
        sub = await self._subscribe(number, sent, batch)
        self._lingering[number] = sub
        while len(self._lingering) > _LINGERING_PULLS:
            _, oldest = self._lingering.popitem(last=False)
            await oldest.unsubscribe()
        # no_wait alone (no expires): the server answers at once, with what it has and then 404.
        request: dict[str, Any] = {"batch": batch}
        if no_wait:
            request["no_wait"] = True
        if wait_first or not no_wait:
            request["expires"] = int(expires * 1e9)
        await self._nc.publish(self._next_subject, json.dumps(request).encode(), reply=sub.subject)
        deadline = sent + expires + _STATUS_GRACE
        while True:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    msg, pulled_at, answers, why = await self._queue.get()
            except TimeoutError:
                return  # no word from the server: this pull's subscription lingers for late deliveries
            if msg is not None:
                yield msg, pulled_at
                continue
            # A pull has ended: unsubscribed here, in the puller's task (not in the subscription's own callback,
            # which unsubscribing would cancel).
            ended = self._lingering.pop(answers, None)
            if ended is not None:
                await ended.unsubscribe()
            if answers == number:
                status = why.split(" ")[0]
                if status == "503":
                    raise NoConsumer(f"nobody answered the pull for tasks ({self._next_subject})")
                if status not in _ENDED:
                    raise PullRefused(f"pull for tasks ended with status {why}")
                return

    async def _subscribe(self, number: int, sent: float, batch: int) -> Any:
        received = 0

        async def on_msg(msg: Msg) -> None:
            nonlocal received
            if not msg.data and _STATUS in (msg.headers or {}):
                # Expired (408) or refused (409): nothing more comes for this pull.
                status = (msg.headers or {}).get(_STATUS, "")
                description = (msg.headers or {}).get("Description", "")
                self._queue.put_nowait((None, 0.0, number, f"{status} {description}".strip()))
                return
            received += 1
            self._queue.put_nowait((msg, sent, number, ""))
            if received >= batch:
                self._queue.put_nowait((None, 0.0, number, "complete"))  # nothing more comes for this pull

        return await self._nc.subscribe(f"{self._inbox}.{number}", cb=on_msg)
