"""The client's reply inbox: one subscription for the replies to every call, each matched to the call it answers,
and a call's wait for its final reply (or for the one the change set's record kept, after a resend)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from rebaser_client._queries import check_answers
from rebaser_core.api import ENQUEUE_UPDATES_RESPONSE, EnqueueUpdatesRequest, EnqueueUpdatesResponse
from rebaser_core.api.success_reply import decode_success
from rebaser_core.errors import ProtocolError, RebaserTimeout
from rebaser_core.nats.deadlines import Deadlines
from rebaser_core.nats.inline_subscription import subscribe_inline

__all__ = ["ReplyInbox"]


class ReplyInbox:
    """Replies arrive on ``<prefix>.<request id>``; a reply is taken only if it is about the request it answers."""

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self.prefix: str | None = None  # set by the first call (subscribed then)
        self._sub: Subscription | None = None
        self._lock = asyncio.Lock()
        # request id -> (the caller's future, the request): a reply is checked against the request it answers
        self._waiting: dict[str, tuple[asyncio.Future[EnqueueUpdatesResponse], EnqueueUpdatesRequest]] = {}
        self._deadlines = Deadlines()  # of the calls awaiting their replies

    async def open(self) -> str:
        """The inbox prefix, subscribed at the first call."""
        if self.prefix is not None:
            return self.prefix  # every call but the first: no lock to take
        # Locked: two first calls at once would each subscribe an inbox, and close() would unsubscribe only one.
        async with self._lock:
            if self.prefix is None:
                prefix = self._nc.new_inbox()
                # Replies are decoded as nats-py reads them (no task hop per reply): see inline_subscription.
                self._sub = await subscribe_inline(self._nc, f"{prefix}.*", self._on_reply)
                self.prefix = prefix
            return self.prefix

    async def call(
        self,
        request: EnqueueUpdatesRequest,
        timeout: float,
        publish: Callable[[str], Awaitable[bool]],
        recorded_reply: Callable[[asyncio.Future[EnqueueUpdatesResponse]], Coroutine[Any, Any, None]],
    ) -> EnqueueUpdatesResponse:
        """Publish ``request`` (``publish`` is given its reply address, and says whether the stream held the request
        already) and await its final reply; :class:`~rebaser_core.errors.RebaserTimeout` after ``timeout``. For a
        request the stream held already, ``recorded_reply`` asks the daemons for the reply its record kept."""
        inbox = await self.open()
        rid = str(request.id)
        # Registered before publishing, so a fast reply cannot arrive before anyone listens. The waiter stays
        # until the *final* reply: the daemon sends none for a retryable failure, only after the retry.
        future = self.expect(request)
        recorded: asyncio.Task[None] | None = None
        try:
            async with self._deadlines.after(timeout):  # asyncio.timeout, on one timer for all calls
                if await publish(f"{inbox}.{rid}"):
                    # The stream already held this request (a resend after a lost ack or a lost reply), so this
                    # publish will get no reply of its own, and the first one's may have gone where nobody listens
                    # any more. Ask the daemons for the recorded reply until it is there (or a reply comes).
                    recorded = asyncio.create_task(recorded_reply(future))
                response: EnqueueUpdatesResponse = await future
                return response
        except TimeoutError:
            raise RebaserTimeout(
                f"no reply to request {rid} within {timeout}s (it is enqueued and may still be applied)"
            ) from None
        finally:
            self.forget(request)
            if recorded is not None:
                recorded.cancel()

    def expect(self, request: EnqueueUpdatesRequest) -> asyncio.Future[EnqueueUpdatesResponse]:
        """The future the reply to ``request`` resolves. Register before publishing, so a fast reply cannot arrive
        before anyone listens; :meth:`forget` once done."""
        future: asyncio.Future[EnqueueUpdatesResponse] = asyncio.get_running_loop().create_future()
        self._waiting[str(request.id)] = (future, request)
        return future

    def forget(self, request: EnqueueUpdatesRequest) -> None:
        self._waiting.pop(str(request.id), None)

    async def close(self) -> None:
        for future, _ in self._waiting.values():
            future.cancel()
        self._waiting.clear()
        if self._sub is not None:
            sub, self._sub = self._sub, None
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    def _on_reply(self, msg: Msg) -> None:
        rid = msg.subject.rsplit(".", 1)[-1]
        future, request = self._waiting.get(rid, (None, None))
        if future is None or request is None or future.done():
            return  # late or duplicate reply: the caller has moved on
        try:
            # A success as a daemon sends it, without pydantic; anything else in full (rebaser_core.api.success_reply).
            response = decode_success(msg.headers, msg.data, request)
            if response is None:
                response = ENQUEUE_UPDATES_RESPONSE.decode(msg.headers, msg.data)
                check_answers(request, response)
            future.set_result(response)
        except ProtocolError as err:
            future.set_exception(err)
