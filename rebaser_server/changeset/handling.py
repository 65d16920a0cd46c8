"""One request of an owned change set: decide what it is, apply it at most once, stage its outcome for the commit.

Every request ends in exactly one staged outcome, committed with the group (see ``group.py``):

- **already processed** (its stream sequence is at or below the record's ``applied_seq``): never applied again;
  answered from the record if the reply is still there;
- **suspect** (first in line after the owner died or froze holding the task, ``max_attempts`` times): dead-lettered;
- **undecodable or not for this change set**: dead-lettered with an error reply;
- **replayed** (its id is in the record: a client resent it): answered from the record;
- otherwise **applied**; a permanent failure is dead-lettered with an error reply, a retryable one is counted and
  raises :class:`Retry` (the request stays first in line).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from nats.aio.msg import Msg

from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    ErrorStatus,
)
from rebaser_core.errors import FencedError, ProtocolError, UnprocessableError
from rebaser_core.headers import check_msg_id
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.group import CommitGroup
from rebaser_server.changeset.outcome import LeaseLost, Retry, Wedged
from rebaser_server.changeset.replies import dead_letter, reply_inbox, request_id_of
from rebaser_server.changeset.runtime import Runtime
from rebaser_server.record.model import ChangeSetRecord

__all__ = ["RequestHandler"]

log = logging.getLogger(__name__)
T = TypeVar("T")
Step = Callable[[Coroutine[Any, Any, T]], Awaitable[T]]


def processed(record: ChangeSetRecord, seq: int) -> ChangeSetRecord:
    """``record`` with the request at ``seq`` marked processed (and a suspicion of it settled)."""
    return replace(record, **processed_fields(record, seq))


def processed_fields(record: ChangeSetRecord, seq: int) -> dict[str, Any]:
    """The fields :func:`processed` changes, for a caller that changes others too (one copy of the record)."""
    suspect = record.suspect if record.suspect and record.suspect[0] > seq else None
    return {"applied_seq": max(record.applied_seq, seq), "suspect": suspect}


class RequestHandler:
    def __init__(self, rt: Runtime, change_set: ChangeSet, commits: CommitGroup, step: Step[Any]) -> None:
        self._rt = rt
        self._change_set = change_set
        self._commits = commits
        self._step = step

    async def group(self) -> CommitGroup:
        """The open commit group (opened now if none): it holds the commit lock until flushed."""
        await self._commits.begin()
        return self._commits

    async def handle(self, msg: Msg, seq: int, *, unclean: bool) -> None:
        """Stage the outcome of one request, the delivery of stream sequence ``seq``. ``unclean``: the first request
        after an unclean takeover."""
        headers = msg.headers or {}
        group = await self.group()
        if seq <= group.base.applied_seq:
            # Processed before, but still in the stream (its purge failed, or the owner died before purging).
            self._rt.stats.requests_replayed += 1
            group.stage(seq, headers, self._recorded_reply(group.base, msg))
            return
        if unclean and await self._suspect_exhausted(msg, seq):
            return
        group = await self.group()
        try:
            # An inbox we may not publish to refuses the request (InvalidReplyInbox); checked once, used by the reply.
            inbox = reply_inbox(self._rt, headers)
            request = ENQUEUE_UPDATES_REQUEST.decode(headers, msg.data)
            check_msg_id(headers, str(request.id))
            if (request.workspace_id, request.change_set_id) != (
                self._change_set.workspace_id,
                self._change_set.change_set_id,
            ):
                raise UnprocessableError(
                    f"request for {request.workspace_id}/{request.change_set_id} was published on {msg.subject}"
                )
        except (ProtocolError, UnprocessableError) as err:
            # Undecodable or not ours: never blocks the change set. Dead-letter it; the error reply (and its removal
            # from the stream) go out with the group, so a purge never runs ahead of an uncommitted group.
            reason = f"{type(err).__name__}: {err}"
            await dead_letter(self._rt, msg, seq, reason)
            group.stage(seq, headers, self._error_response(headers, reason), processed(group.base, seq))
            return
        response = group.base.reply_for(request)
        if response is not None:
            self._rt.stats.requests_replayed += 1
            group.stage(seq, headers, response, processed(group.base, seq), inbox=inbox)
            return
        response, record, dvu = await self._apply(group, request, msg, seq)
        group.stage(seq, headers, response, record, dvu=dvu, applied=True, inbox=inbox)

    def _recorded_reply(self, record: ChangeSetRecord, msg: Msg) -> EnqueueUpdatesResponse | None:
        try:
            return record.reply_for(ENQUEUE_UPDATES_REQUEST.decode(msg.headers or {}, msg.data))
        except (ProtocolError, UnprocessableError, ValueError):
            return None  # it was dead-lettered (and answered) when it was processed

    async def _suspect_exhausted(self, msg: Msg, seq: int) -> bool:
        """Count one more unclean takeover against the first queued request; dead-letter it past max_attempts.

        Counted (committed) *before* it is applied: if applying it kills or freezes this daemon too, the next owner
        sees the count. Costs one write, and only after an unclean takeover.
        """
        group = await self.group()
        base = group.base
        # Attempts that died with their daemon so far (this takeover is the count-th in a row).
        count = base.suspect[1] + 1 if base.suspect and base.suspect[0] == seq else 1
        if count >= self._rt.settings.max_attempts:
            reason = (
                f"gave up after {count} attempts: every daemon that took this request died or froze "
                "before finishing it"
            )
            log.error("%s: request seq %d %s", self._change_set, seq, reason)
            await dead_letter(self._rt, msg, seq, reason)
            headers = msg.headers or {}
            group.stage(seq, headers, self._error_response(headers, reason), processed(base, seq))
            return True
        group.stage(0, {}, None, replace(base, suspect=(seq, count)))
        await group.flush()
        return False

    async def _apply(
        self, group: CommitGroup, request: EnqueueUpdatesRequest, msg: Msg, seq: int
    ) -> tuple[EnqueueUpdatesResponse, ChangeSetRecord, bool]:
        """Apply one request to the group's record; return its reply, the record to stage (the request marked
        processed in it) and whether a DVU is due. A retryable failure commits the group with the attempt counted,
        then raises ``Retry``."""
        rt, settings, record, rid = self._rt, self._rt.settings, group.base, str(request.id)
        try:
            with rt.observe.phase("rebaser.apply"):
                applied = await self._step(rt.app.apply(self._change_set, record.state, request))
        except UnprocessableError as err:
            reason = f"{type(err).__name__}: {err}"  # the §9 form of every error reply
        except (FencedError, LeaseLost):
            raise
        except Exception as err:  # RetryableError, a wedged step, or any bug in the app: up to max_attempts
            attempts = record.attempts.get(rid, 0) + 1
            if attempts < settings.max_attempts:
                # Not its sequence: the failed request must stay in the stream, first in line.
                group.stage(0, {}, None, replace(record, attempts={**record.attempts, rid: attempts}))
                await group.flush()  # what came before is answered; this request stays first in line
                rt.stats.requests_retried += 1
                if isinstance(err, Wedged):
                    raise
                delay = min(settings.retry_backoff * 2 ** (attempts - 1), settings.retry_backoff_max)
                raise Retry(delay, f"attempt {attempts} of request {rid} failed: {err}") from err
            reason = f"gave up after {attempts} attempts: {type(err).__name__}: {err}"
        else:
            response = EnqueueUpdatesResponse(
                id=request.id,
                workspace_id=request.workspace_id,
                change_set_id=request.change_set_id,
                status=applied.status,
            )
            # One copy of the record for the reply, the new state and the request's sequence (two copies were a
            # measurable share of a request's CPU).
            staged = record.with_reply(
                rid,
                response,
                settings.idempotency_window,
                state=applied.state,
                dvu_pending=record.dvu_pending or applied.dvu,
                **processed_fields(record, seq),
            )
            return response, staged, applied.dvu
        # Permanent failure: record the error reply (so a redelivery is answered, not re-run), then dead-letter.
        response = EnqueueUpdatesResponse(
            id=request.id,
            workspace_id=request.workspace_id,
            change_set_id=request.change_set_id,
            status=ErrorStatus(message=reason, retryable=False),
        )
        await dead_letter(rt, msg, seq, reason)
        staged = record.with_reply(
            rid, response, settings.idempotency_window, **processed_fields(record, seq)
        )
        return response, staged, False

    def _error_response(self, headers: dict[str, str], reason: str) -> EnqueueUpdatesResponse:
        return EnqueueUpdatesResponse(
            id=request_id_of(headers),
            workspace_id=self._change_set.workspace_id,
            change_set_id=self._change_set.change_set_id,
            status=ErrorStatus(message=reason, retryable=False),
        )
