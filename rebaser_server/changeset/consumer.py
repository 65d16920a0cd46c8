"""The owned change set's ordered push consumer: created, read in order, reset after a loss, deleted when let go.

Created with ``CONSUMER.CREATE`` over the daemon's light requester (``rebaser_core.nats.requester``) rather than
nats-py's ``add_consumer``, which answers with a fully parsed ``ConsumerInfo`` after a request with a random reply
token: a change set is activated once per quiet period, and every activation would pay for it. Only ``num_pending``
is needed, to know whether anything is queued. The consumer is named by the daemon (a random name), so every
delivery can be checked against it from the first on.

Read by a subscription of its own rather than nats-py's ordered consumer (``subscribe_bind``), which gives every
activation a subscription task and queue, an ordered-consumer state object and two more tasks (an idle-heartbeat
check and a flow-control poll), all created, woken and cancelled per activation, and hands each message through a
queue to the subscription's task. Here messages are read as nats-py reads them (``subscribe_inline``), checked
in order (``ordering.Sequences``) and handled one at a time by a task that runs only while some wait. What nats-py's
ordered consumer does is kept, and made stricter:

- a skipped consumer sequence, or a heartbeat naming another last sequence than ours, resets the consumer: a
  new inbox and a new consumer that starts after the last stream sequence taken; the old one is deleted;
- silence for more than two heartbeat periods resets it too, checked on the lease keeper's tick (``watch``), not
  by a task;
- a flow-control request is answered once the messages before it are handled (``ordering.FlowReplies``), so a
  slow change set's queue stays within the server's window instead of growing with the backlog;
- what comes on the inbox is checked before it is believed: a delivery must name this stream and this consumer
  and a later stream sequence than the last taken; anything else that is not the server's status 100 is
  dropped; flow-control answers go only to this stream's ``$JS.FC.`` subjects. This bounds what a publisher on
  the inbox can do (a reset at most), not everything: one that reads the inbox can copy a delivery's subject, so
  the daemon's inboxes must not be publishable by callers (``docs/nats-accounts.conf`` gives callers no such
  right, and no ``$JS.ACK`` reply subjects).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError
from nats.js import api as nats_api

from rebaser_core.nats.inline_subscription import subscribe_inline
from rebaser_core.nats.requester import Requester, js_api
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.changeset.context import Stats
from rebaser_server.changeset.ordering import GAP, TAKEN, FlowReplies, Sequences
from rebaser_server.task.delivery import Delivery

__all__ = ["RequestConsumer"]

log = logging.getLogger(__name__)

_BACKGROUND: set[asyncio.Task[Any]] = set()

_ACK_PREFIX = "$JS.ACK."
_CONTROL_STATUS = "100"

Handler = Callable[[Msg, Delivery], Awaitable[None]]


def in_background(coro: Coroutine[Any, Any, Any]) -> None:
    """Run ``coro`` to completion without anyone waiting for it (its failure is logged at debug level)."""
    task = asyncio.create_task(coro)
    _BACKGROUND.add(task)  # keep a reference until done, or the task may be garbage-collected mid-flight

    def done(t: asyncio.Task[Any]) -> None:
        _BACKGROUND.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.debug("background cleanup failed: %s", t.exception())

    task.add_done_callback(done)


class RequestConsumer:
    def __init__(
        self,
        names: Subjects,
        subject: str,
        *,
        nc: NatsClient,
        requester: Requester,
        settings: Settings,
        stats: Stats,
    ) -> None:
        self._nc = nc
        self._requester = requester
        self._timeout = settings.nats_timeout
        self._stats = stats
        self._stream = names.requests_stream
        self._subject = subject
        self._heartbeat = settings.consumer_heartbeat
        self._flow_prefix = f"$JS.FC.{self._stream}."
        # The consumer in use: its deliver subject and name (a reset makes new ones), and the start of the reply
        # subject of each of its deliveries (the form without a domain; the other is checked token by token).
        self._inbox = nc.new_inbox()
        self._name: str | None = None
        self._ack_prefix = ""
        self._named()
        self._sub: Any = None
        self._handler: Handler | None = None
        # The owner's context (its trace span), for the handling tasks.
        self._context: contextvars.Context | None = None
        self._seq = Sequences(now=time.monotonic())
        self._flow = FlowReplies()
        self._queue: deque[tuple[Msg, Delivery]] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._generation = 0  # bumped by every reset and by close: a slower reset's late answer is dropped
        self._closed = False
        self.resets = 0

    @property
    def inbox(self) -> str:
        """The deliver subject of the consumer in use (tests forge messages on it)."""
        return self._inbox

    @property
    def name(self) -> str | None:
        return self._name

    async def create(self) -> int:
        """Create the consumer; the number of requests queued for it."""
        answer = await self._create(self._name or self._named(), self._inbox, start=None)
        return int(answer.get("num_pending") or 0)

    async def bind(self, handler: Handler) -> None:
        """Start delivering to ``handler``, one message at a time, in stream order."""
        self._handler = handler
        # The handling task starts from nats-py's read loop; it runs in the owner's context instead (its take span
        # is what each request's span links to), as a nats-py subscription task started from here would.
        self._context = contextvars.copy_context()
        self._seq.last_seen = time.monotonic()
        # Nothing is delivered before this subscribes: a push consumer waits for interest on its deliver subject.
        self._sub = await self._subscribe(self._inbox)

    def watch(self, now: float) -> None:
        """The lease keeper's tick: a bound consumer not heard from for more than two heartbeats is gone; replace
        it."""
        if self._sub is None or self._closed:
            return
        if not self._nc.is_connected:
            # Silence while cut off is the connection's (the reconnect hands every change set back); counted from
            # the reconnect on, or every owned change set would reset at the first tick after it.
            self._seq.last_seen = now
        elif self._seq.silent(now, self._heartbeat):
            self._reset("no message or heartbeat for more than two heartbeat periods")

    async def close(self) -> None:
        self._closed = True
        self._generation += 1
        worker, self._worker = self._worker, None
        if worker is not None and worker is not asyncio.current_task():
            worker.cancel()  # as nats-py's unsubscribe cancels its subscription's task, a handler in hand with it
        self._queue.clear()
        self._flow.forget()
        sub, self._sub = self._sub, None
        name, self._name = self._name, None
        self._handler = self._context = None
        try:
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        finally:
            if name:
                # Off the critical path: nothing waits for it (the server reaps it anyway if this fails). Deleting it
                # keeps the consumer count to active change sets.
                in_background(self._delete(name))

    # -- reading (in nats-py's read loop: quick, never waits) -----------------------------------------------------
    def _on_message(self, inbox: str, msg: Msg) -> None:
        if self._closed or inbox is not self._inbox:
            return  # a replaced consumer's inbox, still subscribed for a moment
        reply = msg.reply
        if reply and reply.startswith(_ACK_PREFIX):
            self._on_delivery(msg, reply)
            return
        headers = msg.headers
        if msg.data or not headers or headers.get("Status") != _CONTROL_STATUS:
            log.debug("%s: ignored a message on the consumer's inbox that is not the server's", self._subject)
            return
        description = headers.get("Description", "")
        now = time.monotonic()
        if description.startswith("Flow"):
            self._seq.last_seen = now
            if reply and reply.startswith(self._flow_prefix) and self._flow.request(reply):
                self._answer(reply)
        elif description.startswith("Idle"):
            # A heartbeat naming a stalled flow-control reply: the server lost our answer, or it is the one held
            # (sent when its messages are handled; answering now would undo the hold).
            stalled = headers.get("Nats-Consumer-Stalled")
            if stalled and stalled.startswith(self._flow_prefix) and not self._flow.holds(stalled):
                self._answer(stalled)
            if not self._seq.heartbeat(_number(headers.get("Nats-Last-Consumer")), now):
                self._reset("a heartbeat names a delivery not taken")

    def _on_delivery(self, msg: Msg, reply: str) -> None:
        if not (reply.startswith(self._ack_prefix) or Delivery.names(reply) == (self._stream, self._name)):
            log.debug("%s: ignored a delivery subject naming another stream or consumer", self._subject)
            return
        try:
            delivery = Delivery.parse(reply)
        except (NotJSMessageError, ValueError):
            log.debug("%s: ignored a message with a malformed delivery subject", self._subject)
            return
        verdict = self._seq.take(delivery.consumer_seq, delivery.stream_seq, time.monotonic())
        if verdict == TAKEN:
            self._flow.received += 1
            self._queue.append((msg, delivery))
            self._start_handling()
        elif verdict == GAP:
            self._reset(f"consumer sequence {delivery.consumer_seq} where {self._seq.expected} was next")
        else:
            log.debug(
                "%s: ignored a delivery of stream sequence %d, not after the last taken",
                self._subject,
                delivery.stream_seq,
            )

    def _start_handling(self) -> None:
        if self._worker is None and self._queue and not self._closed:
            # A copy each time: a Context cannot be entered by two tasks at once (a cancelled one may still unwind).
            context = None if self._context is None else self._context.copy()
            self._worker = asyncio.create_task(self._handle_queued(), context=context)

    def _answer(self, reply: str) -> None:
        in_background(self._nc.publish(reply))

    # -- handling (one at a time, in order) ----------------------------------------------------------------------
    async def _handle_queued(self) -> None:
        # The only task that calls the handler, and only while deliveries wait: one at a time, so in stream order.
        # It ends when the queue is empty and the next delivery starts another (no task idles per owned change set).
        try:
            while self._queue and self._handler is not None:
                msg, delivery = self._queue.popleft()
                try:
                    await self._handler(msg, delivery)
                except Exception:
                    log.exception("%s: handling a request delivery failed", self._subject)
                finally:
                    reply = self._flow.done()  # also when the handler was cancelled: the delivery is over
                    if reply is not None:
                        self._answer(reply)
        finally:
            # Ended by a cancellation escaping the handler: not restarted. Handing the next delivery on would apply
            # it before the one cut short; the processor ends the task instead (retry: the next owner reads both).
            if self._worker is asyncio.current_task():
                self._worker = None

    # -- resets --------------------------------------------------------------------------------------------------
    def _reset(self, why: str) -> None:
        """Replace the consumer by one that starts after the last stream sequence taken (what is queued stays)."""
        log.info("%s: resetting its request consumer: %s", self._subject, why)
        self.resets += 1
        self._stats.consumer_resets += 1
        self._generation += 1
        old_sub, old_name = self._sub, self._name
        self._inbox = self._nc.new_inbox()
        name = self._named()
        now = time.monotonic()
        self._seq = self._seq.restart(now)
        self._flow.forget()
        start = self._seq.last_stream_seq + 1
        in_background(self._recreate(self._generation, name, self._inbox, start, old_sub, old_name))

    async def _recreate(
        self, generation: int, name: str, inbox: str, start: int, old_sub: Any, old_name: str | None
    ) -> None:
        if old_sub is not None:
            with contextlib.suppress(Exception):
                await old_sub.unsubscribe()
        if old_name:
            in_background(self._delete(old_name))
        sub = await self._subscribe(inbox)
        if generation != self._generation:  # closed, or reset again meanwhile
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            return
        self._sub = sub
        try:
            await self._create(name, inbox, start=start)
        except Exception as err:
            # The silence check tries again two heartbeats on; the processor's own limits apply meanwhile.
            log.warning("%s: recreating its request consumer failed: %r", self._subject, err)
            return
        if generation != self._generation:
            in_background(self._delete(name))

    # -- NATS and the JetStream API ------------------------------------------------------------------------------
    def _named(self) -> str:
        """A new name for the consumer in use (random: not guessable from anything a caller sees)."""
        self._name = name = secrets.token_hex(8)
        self._ack_prefix = f"{_ACK_PREFIX}{self._stream}.{name}."
        return name

    async def _subscribe(self, inbox: str) -> Any:
        # Messages carry the stream's subject, not the inbox they came by: each subscription's handler knows its own.
        return await subscribe_inline(self._nc, inbox, functools.partial(self._on_message, inbox))

    async def _create(self, name: str, inbox: str, *, start: int | None) -> dict[str, Any]:
        config = consumer_config(self._subject, inbox, heartbeat=self._heartbeat, start=start)
        config["name"] = name
        request = {"stream_name": self._stream, "config": config}
        return await js_api(
            self._requester, f"CONSUMER.CREATE.{self._stream}.{name}", request, timeout=self._timeout
        )

    async def _delete(self, name: str) -> None:
        await js_api(self._requester, f"CONSUMER.DELETE.{self._stream}.{name}", timeout=self._timeout)


def _number(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return -1  # not a number: no sequence of ours, so the heartbeat check resets


def consumer_config(subject: str, inbox: str, *, heartbeat: float, start: int | None) -> dict[str, Any]:
    """The CONSUMER.CREATE config of a request consumer: from the first request queued, or from stream sequence
    ``start`` (a reset)."""
    config = dict(_config_template(), filter_subject=subject, deliver_subject=inbox)
    config["idle_heartbeat"] = int(heartbeat * 1e9)  # as nats-py converts it
    if start is not None:
        config["deliver_policy"] = nats_api.DeliverPolicy.BY_START_SEQUENCE.value
        config["opt_start_seq"] = start
    return config


@functools.cache
def _config_template() -> dict[str, Any]:
    """Every request consumer's config but its subjects, heartbeat and start: ``ConsumerConfig.as_dict`` (a walk of
    its dataclass fields) costs a tenth of an activation's CPU in a burst of new change sets."""
    return nats_config("<filter>", "<deliver>", heartbeat=5.0, start=None).as_dict()


def nats_config(subject: str, inbox: str, *, heartbeat: float, start: int | None) -> nats_api.ConsumerConfig:
    """The same config as nats-py's dataclass (what ``consumer_config`` must equal, field for field)."""
    return nats_api.ConsumerConfig(
        filter_subject=subject,
        deliver_policy=nats_api.DeliverPolicy.ALL
        if start is None
        else nats_api.DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=start,
        deliver_subject=inbox,
        ack_policy=nats_api.AckPolicy.NONE,
        max_deliver=1,
        flow_control=True,
        idle_heartbeat=heartbeat,
        mem_storage=True,
        num_replicas=1,
        inactive_threshold=30.0,
    )
