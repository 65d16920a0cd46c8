"""One request of an owned change set: decide what it comes to, applying it at most once. Nothing is carried out
here: the handler returns a :class:`~rebaser_server.changeset.decisions.Decision`, and the post-process step
(:mod:`~rebaser_server.changeset.postprocess`) stages it for the commit.

Every request comes to exactly one decision, taken against the record as of everything staged before it:

- **already processed** (its stream sequence is at or below the record's ``applied_seq``): never applied again;
  answered from the record if the reply is still there (REPLAYED);
- **suspect** (first in line after the owner died or froze holding the task): the suspicion written, and one more
  attempt counted if the last owner died with the request in hand (COUNTED), or, at ``max_attempts``, refused with
  a dead letter (REFUSED);
- **undecodable or not for this change set**: refused with an error reply and a dead letter (REFUSED);
- **replayed** (its id is in the record: a client resent it): answered from the record (REPLAYED);
- otherwise **applied** (APPLIED): the app's success or conflicts, or its refusal (a ``refused`` reply, the state
  unchanged, no dead letter); a permanent failure is an error reply with a dead letter, a retryable one counts
  an attempt (RETRY, the request stays first in line) until ``max_attempts``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from nats.aio.msg import Msg
from pydantic import ValidationError

from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    ErrorDetails,
    ErrorStatus,
    RefusedStatus,
)
from rebaser_core.errors import FencedError, ProtocolError, RefusedError, UnprocessableError
from rebaser_core.headers import check_msg_id
from rebaser_core.ids import RequestId
from rebaser_core.inbox import reply_inbox_of, request_id_of
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet, RebaserApp
from rebaser_server.app.calls import apply_request
from rebaser_server.changeset.app_failures import app_failures, app_trace, raised_at
from rebaser_server.changeset.decisions import Decision, Kind
from rebaser_server.changeset.outcome import LeaseLost, PauseNow, Retry, Wedged
from rebaser_server.changeset.replies import UNCHECKED, Unchecked
from rebaser_server.ops.observe import Observer
from rebaser_server.record.model import LAST_ERROR_MAX, ChangeSetRecord

__all__ = ["RequestHandler", "processed", "refused_status"]

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


def refused_status(err: RefusedError) -> RefusedStatus:
    """The reply to an app's refusal; details that are not a JSON object within the bound are left out (and said
    to be), never a failure of the request."""
    message = str(err.message)
    try:
        return RefusedStatus(message=message, details=err.details)
    except ValidationError as invalid:
        log.warning("refusal details left out: %s", invalid.errors()[0]["msg"])
        return RefusedStatus(message=f"{message} (details left out: not a JSON object of at most 4 KiB)")


class RequestHandler:
    """Decides each request of one change set.

    ``step`` runs an app call under the lease (:mod:`~rebaser_server.changeset.steps`); ``subjects`` (shard 0's
    names and the shared ones) and ``settings.reply_inbox_prefix`` say which reply inboxes the daemon may publish
    to (``rebaser_core.inbox``).
    """

    def __init__(
        self,
        change_set: ChangeSet,
        *,
        app: RebaserApp,
        settings: Settings,
        observe: Observer,
        step: Step[Any],
        subjects: Subjects,
    ) -> None:
        self._change_set = change_set
        self._app = app
        self._max_attempts = settings.max_attempts
        self._pause_on_max = settings.on_max_attempts == "pause"
        self._window = settings.idempotency_window
        self._backoff, self._backoff_max = settings.retry_backoff, settings.retry_backoff_max
        self._observe = observe
        self._step = step
        self._inbox_prefix, self._subjects = settings.reply_inbox_prefix, subjects

    async def decide(self, msg: Msg, seq: int, record: ChangeSetRecord, *, unclean: bool) -> Decision:
        """What the request delivered at stream sequence ``seq`` comes to, against ``record`` (the record as of
        everything staged before it). ``unclean``: the first request after an unclean takeover."""
        headers = msg.headers or {}
        if seq <= record.applied_seq:
            # Processed before, but still in the stream (its removal failed, or the owner died before removing it).
            return Decision(Kind.REPLAYED, seq, msg, response=self._recorded_reply(record, msg))
        if unclean:
            return self._suspect(msg, seq, record)
        try:
            # An inbox we may not publish to refuses the request (InvalidReplyInbox); checked once, used by the reply.
            inbox = reply_inbox_of(headers, self._inbox_prefix, self._subjects)
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
            # Undecodable or not ours: never blocks the change set.
            return self._refused(msg, seq, record, f"{type(err).__name__}: {err}")
        response = record.reply_for(request)
        if response is not None:
            return Decision(Kind.REPLAYED, seq, msg, processed(record, seq), response, inbox)
        return await self._apply(record, request, msg, seq, inbox)

    def _recorded_reply(self, record: ChangeSetRecord, msg: Msg) -> EnqueueUpdatesResponse | None:
        try:
            return record.reply_for(ENQUEUE_UPDATES_REQUEST.decode(msg.headers or {}, msg.data))
        except (ProtocolError, UnprocessableError, ValueError):
            return None  # it was dead-lettered (and answered) when it was processed

    def _suspect(self, msg: Msg, seq: int, record: ChangeSetRecord) -> Decision:
        """An unclean takeover: the first queued request becomes a suspect, and each later owner that dies with it
        in hand counts an attempt against it; refused at max_attempts.

        The first owner's death is not counted: nothing tells whether it had begun this request (it may have died
        idle, or in the middle of the requests before it, uncommitted). Every later owner writes the suspicion (this
        decision, COUNTED, committed at once) right before it applies the request, so its death is one with the
        request in hand. Counting the first too dead-lettered healthy requests under extreme SIGKILL churn."""
        # The last owner wrote this suspicion and died: with the request in hand. A new suspect is not counted yet.
        count = record.suspect[1] + 1 if record.suspect and record.suspect[0] == seq else 0
        if count >= self._max_attempts:
            reason = (
                f"gave up after {count} attempts: every daemon that took this request died or froze "
                "before finishing it"
            )
            if self._pause_on_max:
                counted = replace(record, suspect=(seq, count))
                return self._pause(msg, seq, counted, request_id_of(msg.headers or {}), reason, UNCHECKED)
            log.error("%s: request seq %d %s", self._change_set, seq, reason)
            return self._refused(msg, seq, record, reason)
        # Rare (only after an unclean takeover), and what an operator needs to see a crash loop coming.
        log.info(
            "%s: the last owner died or froze holding the task: request seq %d is suspect (%d of %d attempts "
            "that died with it in hand)",
            self._change_set,
            seq,
            count,
            self._max_attempts,
        )
        return Decision(Kind.COUNTED, seq, msg, replace(record, suspect=(seq, count)))

    def _pause(
        self,
        msg: Msg,
        seq: int,
        counted: ChangeSetRecord,
        request_id: RequestId,
        reason: str,
        inbox: str | Unchecked | None,
    ) -> Decision:
        """``on_max_attempts = "pause"``: the attempts are committed, the caller told the change set is paused (not
        remembered as the request's reply: it is tried again on resume), the request stays first in line, and the
        task ends by pausing the change set."""
        message = f"ChangeSetPaused: {reason}; the change set is paused until an operator resumes or skips it"
        response = EnqueueUpdatesResponse(
            id=request_id,
            workspace_id=self._change_set.workspace_id,
            change_set_id=self._change_set.change_set_id,
            status=ErrorStatus(message=message, retryable=True),
        )
        return Decision(
            Kind.RETRY, seq, msg, counted, response, inbox, error=PauseNow(str(request_id), reason)
        )

    def _refused(self, msg: Msg, seq: int, record: ChangeSetRecord, reason: str) -> Decision:
        headers = msg.headers or {}
        response = EnqueueUpdatesResponse(
            id=request_id_of(headers),
            workspace_id=self._change_set.workspace_id,
            change_set_id=self._change_set.change_set_id,
            status=ErrorStatus(message=reason, retryable=False),
        )
        return Decision(Kind.REFUSED, seq, msg, processed(record, seq), response, dead_letter=reason)

    async def _apply(
        self, record: ChangeSetRecord, request: EnqueueUpdatesRequest, msg: Msg, seq: int, inbox: str | None
    ) -> Decision:
        """Apply one request to ``record``: its reply, and the record with the new state and the request marked
        processed; or, after a retryable failure, the attempt to count."""
        rid = str(request.id)
        try:
            with self._observe.phase("rebaser.apply"):
                applied = await self._step(apply_request(self._app, self._change_set, record.state, request))
        except RefusedError as err:
            # The request is wrong: answered, committed like any outcome (a resend gets the same reply), the state
            # left as it was, and no dead letter: nothing for an operator to look at.
            status = refused_status(err)
            refused = EnqueueUpdatesResponse(
                id=request.id,
                workspace_id=request.workspace_id,
                change_set_id=request.change_set_id,
                status=status,
            )
            staged = record.with_reply(rid, refused, self._window, **processed_fields(record, seq))
            return Decision(Kind.APPLIED, seq, msg, staged, refused, inbox)
        except UnprocessableError as err:
            reason = f"{type(err).__name__}: {err}{_at(err)}"  # the §9 form of every error reply
            trace, details = app_trace(err), _details(err)
        except (FencedError, LeaseLost):
            raise
        except Exception as err:  # RetryableError, a wedged step, or any bug in the app: up to max_attempts
            attempts = record.attempts.get(rid, 0) + 1
            if not isinstance(err, Wedged):  # a wedged step is logged where the watchdog finds it
                app_failures.failed(self._change_set, rid, attempts, self._max_attempts, err)
            if attempts < self._max_attempts:
                # Not its sequence: the failed request must stay in the stream, first in line.
                counted = replace(
                    record,
                    attempts={**record.attempts, rid: attempts},
                    last_error=f"{type(err).__name__}: {err}"[:LAST_ERROR_MAX],
                )
                if isinstance(err, Wedged):
                    return Decision(Kind.RETRY, seq, msg, counted, error=err)
                delay = min(self._backoff * 2 ** (attempts - 1), self._backoff_max)
                retry = Retry(delay, f"attempt {attempts} of request {rid} failed: {err}")
                retry.__cause__ = err
                return Decision(Kind.RETRY, seq, msg, counted, error=retry)
            reason = f"gave up after {attempts} attempts: {type(err).__name__}: {err}{_at(err)}"
            trace, details = app_trace(err), _details(err)
            if self._pause_on_max:
                counted = replace(
                    record,
                    attempts={**record.attempts, rid: attempts},
                    last_error=f"{type(err).__name__}: {err}"[:LAST_ERROR_MAX],
                )
                return self._pause(msg, seq, counted, request.id, reason, inbox)
        else:
            response = EnqueueUpdatesResponse(
                id=request.id,
                workspace_id=request.workspace_id,
                change_set_id=request.change_set_id,
                status=applied.status,
            )
            # One copy of the record for the reply, the new state and the request's sequence (two copies are a
            # measurable share of a request's CPU).
            staged = record.with_reply(
                rid,
                response,
                self._window,
                state=applied.state,
                dvu_pending=record.dvu_pending or applied.dvu,
                **processed_fields(record, seq),
            )
            return Decision(Kind.APPLIED, seq, msg, staged, response, inbox, dvu=applied.dvu)
        # Permanent failure: the error reply is recorded (so a redelivery is answered, not re-run) and the request
        # dead-lettered.
        response = EnqueueUpdatesResponse(
            id=request.id,
            workspace_id=request.workspace_id,
            change_set_id=request.change_set_id,
            status=ErrorStatus(message=reason, retryable=False, details=details),
        )
        staged = record.with_reply(rid, response, self._window, **processed_fields(record, seq))
        return Decision(Kind.APPLIED, seq, msg, staged, response, inbox, dead_letter=reason, trace=trace)


def _details(err: BaseException) -> ErrorDetails:
    """The error reply's details (version 3): the exception's class and where in the app it was raised."""
    return ErrorDetails(error_class=type(err).__name__[:128], raised_at=_cut(raised_at(err), 512))


def _cut(text: str | None, limit: int) -> str | None:
    return text if text is None or len(text) <= limit else text[: limit - 1] + "…"


def _at(err: BaseException) -> str:
    """`` (at app.py:42 in apply)``: where in the app ``err`` was raised, for the error reply and the dead letter
    (nothing when no frame of it is the app's)."""
    where = raised_at(err)
    return "" if where is None else f" (at {where})"
