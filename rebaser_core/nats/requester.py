"""Request-reply for the hot paths (publish acks, record commits, purges): lighter than nats-py's ``request``.

nats-py's ``request`` makes every call a fresh random reply token (a NUID plus ``os.urandom`` bytes), a future with
a clean-up callback, and ``asyncio.wait_for`` (another future, a timer, a wrapper). On the paths that run once or
twice per request that machinery is a measurable share of the daemon's and the client's CPU. Here one wildcard
subscription takes every reply, tokens are a counter, and a call is one future (none for :meth:`Requester.send`).
One timer per requester expires every call whose deadline has passed (``rebaser_core.nats.deadlines.Expiries``): a
timer per call (a handle pushed on the event loop's heap, compared in Python, cancelled on the answer) costs 1.5 % of a
daemon's time. The semantics are
nats-py's: ``TimeoutError`` (nats-py's, a ``TimeoutError`` too) after ``timeout``, ``NoRespondersError`` when
nobody listens on the subject. Replies are taken as nats-py reads them (``rebaser_core.nats.inline_subscription``).

An answer due while the connection was down is lost (a restarted server forgot the request; a reply sent to a
client that is gone is dropped), so its caller would wait out the whole timeout. After a reconnect,
:meth:`Requester.fail_lost` ends at once, with ``TimeoutError``, every call sent over the connection that was lost.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.errors import APIError

from rebaser_core.nats.deadlines import Expiries
from rebaser_core.nats.inline_subscription import subscribe_inline

__all__ = ["JS_API", "Answer", "Requester", "answered", "js_api", "last_message", "last_message_direct"]

log = logging.getLogger(__name__)

_STATUS = "Status"
_SEQUENCE_HEADER = "Nats-Sequence"  # added by the server to every message a direct get returns
_NOT_FOUND = "404"
_NO_RESPONDERS = "503"

# The connection of a call made while disconnected: sent on the next one, from nats-py's reconnect buffer.
_BUFFERED = -1

# What ``Requester.send`` hands its callback: the answer, or why there is none (``TimeoutError``,
# ``NoRespondersError``).
Answer = Msg | Exception


class Requester:
    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self._prefix = ""
        self._sub: Any = None
        self._start_lock = asyncio.Lock()
        self._next = 0
        # Every unanswered call: token -> what its answer goes to, and the connection it was sent over (nats-py's
        # reconnect count then; _BUFFERED if it went to the reconnect buffer); and when each times out, on one timer.
        self._callbacks: dict[str, tuple[Callable[[Answer], None], int]] = {}
        self._expiries: Expiries[str] = Expiries(self._timed_out)

    async def _start(self) -> None:
        async with self._start_lock:
            if self._sub is None:
                prefix = self._nc.new_inbox()
                self._sub = await subscribe_inline(self._nc, f"{prefix}.*", self._on_reply)
                self._prefix = prefix + "."

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        self._expiries.clear()
        callbacks, self._callbacks = self._callbacks, {}
        # First: unsubscribing raises on a connection already closed or draining, and no answer can come either way.
        for callback, _ in callbacks.values():
            _call(callback, nats.errors.ConnectionClosedError())
        if sub is not None:
            await sub.unsubscribe()

    async def publish(self, subject: str, payload: bytes, *, headers: dict[str, str] | None = None) -> None:
        """Publish without asking for an answer, on the same connection (and so in order with) the requests."""
        await self._nc.publish(subject, payload, headers=headers)

    async def request(
        self, subject: str, payload: bytes = b"", *, timeout: float, headers: dict[str, str] | None = None
    ) -> Msg:
        if self._sub is None:
            await self._start()
        token, future = self._register(timeout)
        try:
            await self._nc.publish(subject, payload, reply=self._prefix + token, headers=headers)
            return await future
        finally:
            self._forget(token)

    async def send(
        self,
        subject: str,
        payload: bytes,
        *,
        timeout: float,
        on_answer: Callable[[Answer], None],
        headers: dict[str, str] | None = None,
    ) -> None:
        """Publish a request whose answer goes to ``on_answer`` (called once, in nats-py's read loop: it must be
        quick and must not wait): the reply, or nats-py's ``TimeoutError`` after ``timeout``, or
        ``NoRespondersError``. Unlike :meth:`request` it takes no future, task or timer of its own: the deletes of
        processed requests, one per request, use it (rebaser_server.changeset.trimmer). Returns once the
        request is sent."""
        if self._sub is None:
            await self._start()
        token = self._add(on_answer, timeout)
        try:
            await self._nc.publish(subject, payload, reply=self._prefix + token, headers=headers)
        except BaseException:
            self._forget(token)
            raise

    def _add(self, callback: Callable[[Answer], None], timeout: float) -> str:
        """A new reply token whose answer (or timeout) goes to ``callback``."""
        self._next += 1
        token = str(self._next)
        self._expiries.add(token, asyncio.get_running_loop().time() + timeout)  # ValueError for NaN
        nc = self._nc
        self._callbacks[token] = (callback, nc.stats["reconnects"] if nc.is_connected else _BUFFERED)
        return token

    def _forget(self, token: str) -> None:
        self._callbacks.pop(token, None)
        self._expiries.discard(token)

    def _timed_out(self, token: str) -> None:
        entry = self._callbacks.pop(token, None)
        if entry is not None:
            _call(entry[0], nats.errors.TimeoutError())

    def fail_lost(self) -> int:
        """After a reconnect: end every call sent over an earlier connection with ``TimeoutError`` now, not when its
        timeout runs out (its answer, if any, was due while the connection was down, and is lost). A call made
        while disconnected waited in nats-py's reconnect buffer, went out on the new connection, and still waits.
        How many were ended. Like any timeout, it says nothing of whether the request took effect."""
        now = self._nc.stats["reconnects"]
        lost = [token for token, (_, sent_on) in self._callbacks.items() if _BUFFERED < sent_on < now]
        for token in lost:
            self._expiries.discard(token)
            self._timed_out(token)
        return len(lost)

    async def ready(self) -> None:
        """Subscribe the reply subject if not yet done (``request`` does it by itself; ``expect`` needs it done)."""
        if self._sub is None:
            await self._start()

    def expect(self, timeout: float) -> tuple[str, asyncio.Future[Msg]]:
        """A reply subject to publish a request with, and the future its reply resolves (``TimeoutError`` after
        ``timeout``, ``NoRespondersError``). For a caller that must be able to stop waiting while the reply is
        still awaited by someone else: the future outlives the caller (await it through ``asyncio.shield``).
        Cancel it to stop waiting for good. Call :meth:`ready` first."""
        token, future = self._register(timeout)

        def forget(_: asyncio.Future[Msg]) -> None:
            self._forget(token)

        future.add_done_callback(forget)
        return self._prefix + token, future

    def _register(self, timeout: float) -> tuple[str, asyncio.Future[Msg]]:
        """A new reply token and the future its answer settles (or its timeout fails)."""
        future: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        return self._add(functools.partial(_settle, future), timeout), future

    def _on_reply(self, msg: Msg) -> None:
        token = msg.subject[len(self._prefix) :]
        entry = self._callbacks.pop(token, None)
        if entry is not None:
            self._expiries.discard(token)
            try:
                answer: Answer = answered(msg)
            except nats.errors.NoRespondersError as err:
                answer = err
            _call(entry[0], answer)


def _settle(future: asyncio.Future[Msg], answer: Answer) -> None:
    if future.done():  # cancelled by its caller
        return
    if isinstance(answer, Exception):
        future.set_exception(answer)
    else:
        future.set_result(answer)


def _call(callback: Callable[[Answer], None], answer: Answer) -> None:
    try:
        callback(answer)
    except Exception:
        log.exception("handling the answer to a request failed")


def answered(msg: Msg) -> Msg:
    """``msg``, unless it is the server's "no responders" status: then ``NoRespondersError``, as nats-py raises it.

    A stored message that a direct get returns carries its sender's headers, a ``Status`` too; the server adds a
    ``Nats-Sequence`` to it, which its own status replies never have."""
    headers = msg.headers
    if (
        headers
        and headers.get(_STATUS) == _NO_RESPONDERS
        and not msg.data
        and _SEQUENCE_HEADER not in headers
    ):
        raise nats.errors.NoRespondersError
    return msg


JS_API = "$JS.API"
_NO_MESSAGE_FOUND = 10037  # JetStream's answer to a get of a subject that has no message


async def js_api(
    requester: Requester, subject: str, request: dict[str, Any] | None = None, *, timeout: float
) -> dict[str, Any]:
    """One JetStream API call (``subject`` under ``$JS.API.``) over ``requester``: its JSON answer, or the API's
    error as nats-py's ``APIError``."""
    payload = b"" if request is None else json.dumps(request).encode()
    reply = await requester.request(f"{JS_API}.{subject}", payload, timeout=timeout)
    answer: dict[str, Any] = json.loads(reply.data)
    error = answer.get("error")
    if error is not None:
        raise APIError.from_error(error)
    return answer


async def last_message(
    requester: Requester, stream: str, subject: str, *, timeout: float
) -> dict[str, Any] | None:
    """The last message on ``subject`` as ``STREAM.MSG.GET`` returns it (answered by the stream leader, so it never
    misses a message just written), or None if the subject has none."""
    try:
        answer = await js_api(
            requester, f"STREAM.MSG.GET.{stream}", {"last_by_subj": subject}, timeout=timeout
        )
    except APIError as err:
        if err.err_code == _NO_MESSAGE_FOUND:
            return None
        raise
    message: dict[str, Any] = answer["message"]
    return message


async def last_message_direct(
    requester: Requester, stream: str, subject: str, *, timeout: float
) -> Msg | None:
    """The last message on ``subject`` by ``DIRECT.GET`` (the stored message itself, its headers parsed, with the
    server's ``Nats-Sequence``), or None if the subject has none. Raises ``APIError`` for any other status.

    A direct get costs the server a quarter of a ``STREAM.MSG.GET`` (no API request to route, no JSON and base64 to
    write: 13-17 against 53-63 µs of nats-server CPU, ``bench/server_ops.py``) and the caller no JSON and base64 to
    read. But it is answered by any server that holds the stream, a replica too, which can lag behind the leader:
    use it only where the stream has one replica (or where a stale answer is caught anyway). A stored message's
    own headers are the sender's, so a found message is told from the server's status by the ``Nats-Sequence``
    header the server adds to every message it returns, never by a ``Status`` header alone.
    """
    request = b'{"last_by_subj":' + json.dumps(subject).encode() + b"}"
    reply = await requester.request(f"{JS_API}.DIRECT.GET.{stream}", request, timeout=timeout)
    headers = reply.headers or {}
    if _SEQUENCE_HEADER in headers:
        return reply
    status = headers.get(_STATUS)
    if status == _NOT_FOUND:
        return None
    raise APIError(
        code=int(status) if status and status.isdigit() else None, description=headers.get("Description")
    )
