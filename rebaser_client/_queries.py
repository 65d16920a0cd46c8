"""Queries to the daemons (core NATS request-reply on ``<prefix>.rebaser.api.*``): get, fork, reply, settled,
backlog."""

from __future__ import annotations

import asyncio
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient

from rebaser_core.api import (
    GET_REPLY_REQUEST,
    GET_REPLY_RESPONSE,
    MAX_SETTLED_WAIT,
    WAIT_SETTLED_REQUEST,
    WAIT_SETTLED_RESPONSE,
    ContentType,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    ForkChangeSetRequest,
    GetChangeSetRequest,
    GetReplyRequest,
    GetReplyResponse,
    MessageVersion,
    VersionedMessage,
    WaitSettledRequest,
    WaitSettledResponse,
    WorkspaceBacklogRequest,
)
from rebaser_core.errors import ProtocolError, RebaserBusy, RebaserRefused, RebaserTimeout, RebaserUnavailable
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.tasks import ensure_connected
from rebaser_core.subjects import Subjects

__all__ = ["Queries", "check_answers", "refusal"]

# Polling the recorded reply of a resent request: first pause, doubling up to the cap; each query's own timeout.
_RECORDED_REPLY_FIRST_PAUSE = 0.05
_RECORDED_REPLY_MAX_PAUSE = 1.0
QUERY_TIMEOUT = 2.0
# A daemon answering as many queries as it may at once says so with an error that starts with this.
_BUSY = "busy:"
_BUSY_RETRY_AFTER = 0.1


def refusal(error: str) -> RebaserRefused:
    """A query's error answer as the exception to raise: ``RebaserBusy(limit="queries")`` if the daemon answers
    as many queries as it may already (asking again is expected to work), else ``RebaserRefused``."""
    if error.startswith(_BUSY):
        return RebaserBusy(error, retry_after=_BUSY_RETRY_AFTER, limit="queries")
    return RebaserRefused(error)


def check_answers(request: MessageVersion, response: MessageVersion) -> None:
    """A reply must be about the request it answers: a forged or misrouted outcome is never accepted."""
    for field in ("id", "workspace_id", "change_set_id"):
        asked, answered = getattr(request, field), getattr(response, field, None)
        if answered != asked:
            raise ProtocolError(f"reply to request {request.id} carries {field} {answered}, expected {asked}")


class Queries:
    def __init__(self, nc: NatsClient, subjects: Subjects, content_type: ContentType) -> None:
        self._nc = nc
        self._subjects = subjects
        self._content_type = content_type

    async def ask(
        self,
        operation: str,
        request: MessageVersion,
        codec: VersionedMessage[Any],
        reply_codec: VersionedMessage[Any],
        timeout: float,
    ) -> MessageVersion:
        """Send one query and return its checked answer."""
        assert isinstance(
            request,
            GetChangeSetRequest
            | ForkChangeSetRequest
            | GetReplyRequest
            | WaitSettledRequest
            | WorkspaceBacklogRequest,
        )
        subject = self._subjects.api(operation, request.workspace_id, request.change_set_id)
        headers, body = codec.encode(request, self._content_type)
        ensure_connected(self._nc, f"{operation} query")
        try:
            reply = await self._nc.request(subject, body, headers=headers, timeout=timeout)
        except nats.errors.NoRespondersError:
            raise RebaserUnavailable(f"no daemon answers {operation} queries on {subject}") from None
        except TimeoutError:
            raise RebaserTimeout(f"{operation} query got no answer within {timeout}s") from None
        except nats.errors.Error as err:  # the connection closed or dropped mid-request
            raise RebaserUnavailable(f"{operation} query failed: {err or type(err).__name__}") from None
        response: MessageVersion = reply_codec.decode(reply.headers, reply.data)
        check_answers(request, response)
        return response

    async def wait_settled(
        self, workspace_id: WorkspacePk, change_set_id: ChangeSetId, timeout: float
    ) -> WaitSettledResponse:
        """``RebaserClient.wait_settled``: as many held queries as ``timeout`` takes."""
        if not timeout >= 0:  # NaN too: it never reaches a deadline, and the loop below would ask forever
            raise RebaserRefused(f"wait_settled: timeout must be a number of seconds >= 0, got {timeout}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            # A daemon holds one wait at most MAX_SETTLED_WAIT: longer waits are several queries.
            hold = min(max(0.0, deadline - loop.time()), MAX_SETTLED_WAIT)
            request = WaitSettledRequest(
                id=RequestId.new(), workspace_id=workspace_id, change_set_id=change_set_id, timeout=hold
            )
            # The daemon answers by itself after ``hold``; the margin is for the answer's way back.
            response = await self.ask(
                "settled", request, WAIT_SETTLED_REQUEST, WAIT_SETTLED_RESPONSE, hold + QUERY_TIMEOUT
            )
            assert isinstance(response, WaitSettledResponse)
            if response.error is None and response.settled:
                return response
            if response.error is not None and not response.error.endswith("ask again"):
                raise RebaserRefused(response.error)
            if loop.time() >= deadline:
                raise RebaserTimeout(
                    f"change set {change_set_id} not settled within {timeout}s "
                    f"(requests queued: {response.queued}, DVU due: {response.dvu_pending})"
                )
            if response.error is not None:
                # The daemon stopped or was full: ask again (another daemon answers), not in a tight loop.
                await asyncio.sleep(min(_RECORDED_REPLY_FIRST_PAUSE, max(0.0, deadline - loop.time())))
            # Otherwise the daemon's wait was capped (MAX_SETTLED_WAIT) before ours: ask again at once.

    async def recorded_reply(
        self, request: EnqueueUpdatesRequest, future: asyncio.Future[EnqueueUpdatesResponse]
    ) -> None:
        """Poll the ``reply`` query until the change set's record holds this request's reply; set ``future``."""
        pause = _RECORDED_REPLY_FIRST_PAUSE
        query = GetReplyRequest(
            id=RequestId.new(),
            workspace_id=request.workspace_id,
            change_set_id=request.change_set_id,
            request_id=request.id,
        )
        while not future.done():
            try:
                answer = await self.ask("reply", query, GET_REPLY_REQUEST, GET_REPLY_RESPONSE, QUERY_TIMEOUT)
            except (RebaserTimeout, RebaserUnavailable, ProtocolError):
                answer = None
            if isinstance(answer, GetReplyResponse) and answer.found and answer.status is not None:
                if not future.done():
                    future.set_result(
                        EnqueueUpdatesResponse(
                            id=request.id,
                            workspace_id=request.workspace_id,
                            change_set_id=request.change_set_id,
                            status=answer.status,
                        )
                    )
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, _RECORDED_REPLY_MAX_PAUSE)
