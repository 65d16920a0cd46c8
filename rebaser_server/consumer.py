"""The owned change set's ordered push consumer: created, bound to a callback, and deleted when let go.

Created with ``CONSUMER.CREATE`` over the daemon's light requester (``rebaser_core.requester``) rather than nats-py's
``add_consumer``, which answers with a fully parsed ``ConsumerInfo`` (a dozen nested dataclasses) after a request
with a random reply token and ``wait_for``: a change set is activated once per quiet period, and every activation
paid for it. Only the consumer's name and ``num_pending`` are needed: the name to bind to, ``num_pending`` to know
whether anything is queued. Then ``subscribe_bind`` makes it nats-py's ordered consumer (gap detection, resets,
flow control).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg
from nats.js import api as nats_api

from rebaser_core.requester import js_api
from rebaser_core.subjects import Subjects
from rebaser_server.runtime import Runtime

__all__ = ["Created", "RequestConsumer"]

log = logging.getLogger(__name__)

_BACKGROUND: set[asyncio.Task[Any]] = set()


def in_background(coro: Coroutine[Any, Any, Any]) -> None:
    """Run ``coro`` to completion without anyone waiting for it (its failure is logged at debug level)."""
    task = asyncio.create_task(coro)
    _BACKGROUND.add(task)  # keep a reference until done, or the task may be garbage-collected mid-flight

    def done(t: asyncio.Task[Any]) -> None:
        _BACKGROUND.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.debug("background cleanup failed: %s", t.exception())

    task.add_done_callback(done)


@dataclass(frozen=True, slots=True)
class Created:
    name: str
    num_pending: int  # requests queued when it was created


class RequestConsumer:
    def __init__(self, rt: Runtime, names: Subjects, subject: str) -> None:
        self._rt = rt
        self._stream = names.requests_stream
        self._config = _consumer_config(subject, rt.nc.new_inbox())
        self._name: str | None = None
        self._sub: Any = None

    async def create(self) -> Created:
        rt = self._rt
        config = dict(_config_template(), filter_subject=self._config.filter_subject)
        config["deliver_subject"] = self._config.deliver_subject
        request = {"stream_name": self._stream, "config": config}
        answer = await js_api(
            rt.requester, f"CONSUMER.CREATE.{self._stream}", request, timeout=rt.settings.nats_timeout
        )
        self._name = str(answer["name"])
        return Created(self._name, int(answer.get("num_pending") or 0))

    async def bind(self, created: Created, cb: Callable[[Msg], Awaitable[None]]) -> None:
        """Start delivering to ``cb``, one message at a time, as nats-py's ordered consumer."""
        self._sub = await self._rt.js.subscribe_bind(
            self._stream, self._config, created.name, cb=cb, ordered_consumer=True
        )
        _no_flow_control_polling(self._rt, self._sub)

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        # Unsubscribing leaves the server-side consumer until the server reaps it; delete it so the consumer
        # count tracks active change sets. After a reset the ordered consumer has a new name.
        name = getattr(sub, "_consumer", None) or self._name
        self._name = None
        _untie(sub)
        if name:
            # Off the critical path: nothing waits for it (and the server reaps it anyway if this fails).
            in_background(self._delete(name))

    async def _delete(self, name: str) -> None:
        rt = self._rt
        await js_api(rt.requester, f"CONSUMER.DELETE.{self._stream}.{name}", timeout=rt.settings.nats_timeout)


@functools.cache
def _config_template() -> dict[str, Any]:
    """The CONSUMER.CREATE config of every request consumer but its two subjects: ``ConsumerConfig.as_dict`` (a
    walk of its dataclass fields) was a tenth of an activation's CPU in a burst of new change sets."""
    return _consumer_config("<filter>", "<deliver>").as_dict()


def _consumer_config(subject: str, deliver_subject: str) -> nats_api.ConsumerConfig:
    return nats_api.ConsumerConfig(
        filter_subject=subject,
        deliver_policy=nats_api.DeliverPolicy.ALL,
        deliver_subject=deliver_subject,
        ack_policy=nats_api.AckPolicy.NONE,
        max_deliver=1,
        flow_control=True,
        idle_heartbeat=5.0,
        mem_storage=True,
        num_replicas=1,
        inactive_threshold=30.0,
    )


def _untie(psub: Any) -> None:
    """Break the reference cycle of an unsubscribed nats-py ordered consumer (nats-py 2.16).

    Its subscription and its ordered-consumer state (``_JSI``) point at each other, and the subscription holds our
    callback, so an owned change set let go was freed only by the cycle collector, with everything it held: about
    sixty objects per activation, left for the collector's walks (a tenth of a daemon's CPU in a burst of new change
    sets, with this and the DVU loop's cycle). ``_jsi = None`` is what a plain subscription has, and every use of it
    in nats-py, after unsubscribing, checks it first.
    """
    # nats-py's PushSubscription wraps the Subscription it was made from.
    inner: Any = getattr(psub, "_sub", None)
    jsi = getattr(inner, "_jsi", None)
    if jsi is None or not getattr(psub, "_closed", False):
        return
    # nats-py cancels these two in unsubscribe() only once the UNSUB went out; cancelled here in any case, or a
    # heartbeat check left running with ``_jsi`` gone would recreate the consumer every few seconds for ever.
    for name in ("_hbtask", "_fctask"):
        task = getattr(jsi, name, None)
        if task is not None:
            task.cancel()
    inner._jsi = None


def _no_flow_control_polling(rt: Runtime, psub: Any) -> None:
    """Stop nats-py's flow-control task of an ordered consumer with a callback (ours).

    nats-py starts, for every ordered consumer, a task that wakes four times a second to send a flow-control reply
    put off until the messages before it are delivered. For a subscription with a callback it counts a message as
    delivered when it is received, so it answers every flow-control request at once and that task never has
    anything to send (nats-py 2.16); with thousands of owned change sets its wake-ups were thousands a second, idle
    or not. Should a reply ever be put off (another nats-py version), it is sent at once, as nats-py does now. A
    stalled consumer is also answered from its heartbeat, by nats-py, as before.
    """
    jsi = getattr(getattr(psub, "_sub", None), "_jsi", None)
    task = getattr(jsi, "_fctask", None)
    if jsi is None or task is None or not hasattr(jsi, "schedule_flow_control_response"):
        return  # not the nats-py this was written for: leave it as it is
    task.cancel()
    jsi._fctask = None

    def answer_now(reply: str) -> None:
        in_background(rt.nc.publish(reply))

    jsi.schedule_flow_control_response = answer_now
