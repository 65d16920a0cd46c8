"""Every way one request delivery is decided (``rebaser_server/changeset/handling.py``), without a server: a fake
app, a record in memory and hand-built messages."""

from __future__ import annotations

import re
from collections.abc import Coroutine
from typing import Any

import pytest
from nats.aio.msg import Msg

from rebaser_core import headers as h
from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    ConflictsStatus,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    ErrorStatus,
    InlineUpdates,
    SetLiteral,
    SuccessStatus,
)
from rebaser_core.api.enqueue_updates_response import Conflict
from rebaser_core.errors import FencedError, RetryableError, UnprocessableError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_server.app import Applied, AppState, ChangeSet
from rebaser_server.changeset.decisions import Decision, Kind
from rebaser_server.changeset.handling import RequestHandler, processed
from rebaser_server.changeset.outcome import LeaseLost, Retry, Wedged
from rebaser_server.ops.observe import Observer
from rebaser_server.record.model import ChangeSetRecord
from rebaser_server.testing import fast_settings

INBOX = "_INBOX.handling.test"
WINDOW = 64


class FakeApp:
    """Applies by appending the request id to ``state["applied"]``; or fails as ``fail`` says (an exception
    instance raised on every call)."""

    def __init__(self, *, fail: BaseException | None = None, dvu: bool = False) -> None:
        self.fail = fail
        self.dvu = dvu
        self.calls: list[tuple[ChangeSet, AppState, str]] = []

    async def start(self, nc: Any, settings: Settings) -> None:
        return None

    async def stop(self) -> None:
        return None

    def initial_state(self, change_set: ChangeSet) -> AppState:
        return {"applied": []}

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        self.calls.append((change_set, state, str(request.id)))
        if self.fail is not None:
            raise self.fail
        return Applied(
            SuccessStatus(updates_performed=1), {"applied": [*state["applied"], str(request.id)]}, self.dvu
        )

    async def dependent_values_update(self, change_set: ChangeSet, state: AppState) -> AppState:
        return state


class Steps:
    """The ``step`` a handler runs app calls with: here it only awaits them, and counts them."""

    def __init__(self) -> None:
        self.runs = 0

    async def __call__(self, coro: Coroutine[Any, Any, Any]) -> Any:
        self.runs += 1
        return await coro


def _settings(**overrides: object) -> Settings:
    return fast_settings(None, idempotency_window=WINDOW, **overrides)


def _change_set() -> ChangeSet:
    return ChangeSet(WorkspacePk.new(), ChangeSetId.new())


def _handler(
    change_set: ChangeSet, app: FakeApp, settings: Settings | None = None, steps: Steps | None = None
) -> RequestHandler:
    settings = settings or _settings()
    return RequestHandler(
        change_set,
        app=app,
        settings=settings,
        observe=Observer(),
        step=steps or Steps(),
        subjects=settings.subjects,
    )


def _request(change_set: ChangeSet) -> EnqueueUpdatesRequest:
    return EnqueueUpdatesRequest(
        id=RequestId.new(),
        workspace_id=change_set.workspace_id,
        change_set_id=change_set.change_set_id,
        updates=InlineUpdates(updates=[SetLiteral(path="/n", value=1)]),
    )


def _msg(
    change_set: ChangeSet,
    request: EnqueueUpdatesRequest | None = None,
    *,
    inbox: str | None = INBOX,
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
) -> Msg:
    """A request delivery as the ordered consumer hands it over: headers and body from the wire codec, or the
    ``headers`` / ``data`` given."""
    encoded_headers, body = (
        ENQUEUE_UPDATES_REQUEST.encode(request, reply_inbox=inbox) if request is not None else ({}, b"")
    )
    subject = _settings().subjects.requests(change_set.workspace_id, change_set.change_set_id)
    return Msg(
        _client=None,  # type: ignore[arg-type]  # never used: a decision does not touch the connection
        subject=subject,
        data=body if data is None else data,
        headers=encoded_headers if headers is None else headers,
    )


def _record(**fields: Any) -> ChangeSetRecord:
    return ChangeSetRecord(epoch=3, owner="me", state={"applied": []}, **fields)


def _ok(request: EnqueueUpdatesRequest, performed: int = 1) -> EnqueueUpdatesResponse:
    return EnqueueUpdatesResponse(
        id=request.id,
        workspace_id=request.workspace_id,
        change_set_id=request.change_set_id,
        status=SuccessStatus(updates_performed=performed),
    )


def _error(decision: Decision) -> ErrorStatus:
    assert decision.response is not None
    status = decision.response.status
    assert isinstance(status, ErrorStatus), status
    return status


# -- already processed ----------------------------------------------------------------------------------------


async def test_a_request_at_or_below_applied_seq_is_replayed_from_the_record_and_never_applied() -> None:
    cs, app = _change_set(), FakeApp()
    request = _request(cs)
    record = _record(applied_seq=10).with_reply(str(request.id), _ok(request, performed=7), WINDOW)
    for seq in (10, 4):
        decision = await _handler(cs, app).decide(_msg(cs, request), seq, record, unclean=False)
        assert decision.kind is Kind.REPLAYED and decision.seq == seq
        assert decision.record is None  # nothing to commit for it
        assert decision.response == _ok(request, performed=7)
        assert decision.dead_letter is None and decision.processed
    assert app.calls == []


async def test_a_processed_request_whose_reply_is_forgotten_or_undecodable_is_replayed_without_one() -> None:
    cs, app = _change_set(), FakeApp()
    record = _record(applied_seq=10)
    forgotten = await _handler(cs, app).decide(_msg(cs, _request(cs)), 9, record, unclean=False)
    garbage = await _handler(cs, app).decide(
        _msg(cs, headers={h.CONTENT_TYPE: "application/cbor"}, data=b"\xff\x00"), 8, record, unclean=False
    )
    for decision in (forgotten, garbage):
        assert decision.kind is Kind.REPLAYED and decision.response is None and decision.record is None
    # Already processed wins over an unclean takeover: it is not a suspect.
    again = await _handler(cs, app).decide(_msg(cs, _request(cs)), 10, record, unclean=True)
    assert again.kind is Kind.REPLAYED
    assert app.calls == []


# -- suspect (the first request after an unclean takeover) ----------------------------------------------------


async def test_an_unclean_takeover_makes_the_first_request_a_suspect_and_each_later_one_counts_an_attempt() -> (
    None
):
    """The first owner's death is not counted (nothing says it had begun the request); each later owner wrote the
    suspicion right before applying it, so its death counts."""
    cs, app = _change_set(), FakeApp()
    handler = _handler(cs, app, _settings(max_attempts=3))
    msg = _msg(cs, _request(cs))
    first = await handler.decide(msg, 11, _record(applied_seq=10), unclean=True)
    assert first.kind is Kind.COUNTED and not first.processed
    assert first.record is not None and first.record.suspect == (11, 0)
    assert first.record.applied_seq == 10  # still to be applied
    assert first.response is None and first.dead_letter is None
    second = await handler.decide(msg, 11, first.record, unclean=True)
    assert second.kind is Kind.COUNTED
    assert second.record is not None and second.record.suspect == (11, 1)
    # A suspicion of another request does not carry over: it starts again, uncounted.
    other = await handler.decide(msg, 12, _record(applied_seq=11, suspect=(11, 2)), unclean=True)
    assert other.record is not None and other.record.suspect == (12, 0)
    assert app.calls == []


async def test_a_request_every_owner_died_on_is_refused_with_a_dead_letter_at_max_attempts() -> None:
    cs, app = _change_set(), FakeApp()
    request = _request(cs)
    handler = _handler(cs, app, _settings(max_attempts=3))
    decision = await handler.decide(
        _msg(cs, request), 11, _record(applied_seq=10, suspect=(11, 2)), unclean=True
    )
    assert decision.kind is Kind.REFUSED and decision.processed
    assert decision.dead_letter is not None and "gave up after 3 attempts" in decision.dead_letter
    assert decision.record is not None
    assert decision.record.applied_seq == 11 and decision.record.suspect is None
    status = _error(decision)
    assert status.retryable is False and status.message == decision.dead_letter
    assert decision.response is not None and decision.response.id == request.id  # from its Nats-Msg-Id
    assert app.calls == []


async def test_max_attempts_of_one_refuses_once_one_owner_died_with_the_request_in_hand() -> None:
    cs, app = _change_set(), FakeApp()
    handler = _handler(cs, app, _settings(max_attempts=1))
    first = await handler.decide(_msg(cs, _request(cs)), 1, _record(), unclean=True)
    assert first.kind is Kind.COUNTED and first.record is not None
    decision = await handler.decide(_msg(cs, _request(cs)), 1, first.record, unclean=True)
    assert decision.kind is Kind.REFUSED and decision.dead_letter is not None


# -- refused: undecodable, not ours, nowhere safe to answer ----------------------------------------------------


async def test_an_undecodable_request_is_refused_with_a_dead_letter() -> None:
    cs, app = _change_set(), FakeApp()
    rid = RequestId.new()
    headers = {
        h.CONTENT_TYPE: "application/cbor",
        h.MESSAGE_TYPE: "EnqueueUpdatesRequest",
        h.MESSAGE_VERSION: "3",
        h.NATS_MSG_ID: str(rid),
        h.REPLY_INBOX: INBOX,
    }
    decision = await _handler(cs, app).decide(
        _msg(cs, headers=headers, data=b"\xff\x00garbage"), 5, _record(applied_seq=4), unclean=False
    )
    assert decision.kind is Kind.REFUSED
    assert decision.dead_letter is not None and decision.dead_letter.startswith("DecodeError")
    assert decision.record is not None and decision.record.applied_seq == 5
    assert decision.response is not None and decision.response.id == rid
    assert (decision.response.workspace_id, decision.response.change_set_id) == (
        cs.workspace_id,
        cs.change_set_id,
    )
    assert _error(decision).message == decision.dead_letter
    assert app.calls == []


async def test_an_unsupported_message_version_is_refused() -> None:
    cs, app = _change_set(), FakeApp()
    headers, body = ENQUEUE_UPDATES_REQUEST.encode(_request(cs), reply_inbox=INBOX)
    decision = await _handler(cs, app).decide(
        _msg(cs, headers={**headers, h.MESSAGE_VERSION: "99"}, data=body), 1, _record(), unclean=False
    )
    assert decision.kind is Kind.REFUSED
    assert decision.dead_letter is not None and "UnsupportedMessageVersion" in decision.dead_letter
    assert app.calls == []


async def test_a_request_for_another_change_set_is_refused() -> None:
    cs, other, app = _change_set(), _change_set(), FakeApp()
    # Published on this change set's subject, but its body names another one.
    decision = await _handler(cs, app).decide(_msg(cs, _request(other)), 1, _record(), unclean=False)
    assert decision.kind is Kind.REFUSED
    assert decision.dead_letter is not None and decision.dead_letter.startswith("UnprocessableError")
    assert str(other.change_set_id) in decision.dead_letter
    assert decision.record is not None and decision.record.applied_seq == 1
    assert app.calls == []


async def test_a_request_whose_msg_id_is_not_its_id_is_refused() -> None:
    cs, app = _change_set(), FakeApp()
    headers, body = ENQUEUE_UPDATES_REQUEST.encode(_request(cs), reply_inbox=INBOX)
    decision = await _handler(cs, app).decide(
        _msg(cs, headers={**headers, h.NATS_MSG_ID: str(RequestId.new())}, data=body),
        1,
        _record(),
        unclean=False,
    )
    assert decision.kind is Kind.REFUSED and decision.dead_letter is not None
    assert app.calls == []


@pytest.mark.parametrize(
    "inbox",
    ["$KV.REBASER_CHANGE_SETS.x", "elsewhere.inbox", "_INBOX.has space", "_INBOX.*", "_INBOX." + "x" * 300],
)
async def test_a_request_naming_a_reply_inbox_the_daemon_may_not_publish_to_is_refused(inbox: str) -> None:
    cs, app = _change_set(), FakeApp()
    decision = await _handler(cs, app).decide(
        _msg(cs, _request(cs), inbox=inbox), 1, _record(), unclean=False
    )
    assert decision.kind is Kind.REFUSED
    assert decision.dead_letter is not None and decision.dead_letter.startswith("InvalidReplyInbox")
    assert app.calls == []


# -- replayed: the request id is remembered ---------------------------------------------------------------------


async def test_a_resent_request_is_answered_from_the_record_and_marked_processed() -> None:
    cs, app = _change_set(), FakeApp()
    request = _request(cs)
    record = _record(applied_seq=3).with_reply(str(request.id), _ok(request, performed=2), WINDOW)
    decision = await _handler(cs, app).decide(_msg(cs, request), 8, record, unclean=False)
    assert decision.kind is Kind.REPLAYED and decision.processed
    assert decision.response == _ok(request, performed=2)
    assert decision.record is not None and decision.record.applied_seq == 8
    assert decision.record.state == record.state and decision.record.recent == record.recent
    assert decision.inbox == INBOX  # checked once, used by the reply
    assert decision.dead_letter is None
    assert app.calls == []


# -- applied ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dvu", [False, True])
async def test_a_new_request_is_applied_and_its_reply_remembered(dvu: bool) -> None:
    cs, app, steps = _change_set(), FakeApp(dvu=dvu), Steps()
    request = _request(cs)
    # An earlier failed attempt of this request is forgotten once it is applied; another request's is kept.
    record = _record(applied_seq=6, attempts={str(request.id): 2, "other": 1}, suspect=(9, 1))
    decision = await _handler(cs, app, steps=steps).decide(_msg(cs, request), 7, record, unclean=False)
    assert decision.kind is Kind.APPLIED and decision.processed and decision.seq == 7
    assert steps.runs == 1 and app.calls == [(cs, {"applied": []}, str(request.id))]
    assert decision.response == _ok(request)
    assert decision.inbox == INBOX and decision.dead_letter is None and decision.error is None
    assert decision.dvu is dvu
    staged = decision.record
    assert staged is not None
    assert staged.applied_seq == 7 and staged.state == {"applied": [str(request.id)]}
    assert staged.dvu_pending is dvu
    assert staged.reply_for(request) == _ok(request)
    assert dict(staged.attempts) == {"other": 1}
    assert staged.suspect == (9, 1)  # a suspicion of a later request stays
    assert (staged.epoch, staged.owner) == (record.epoch, record.owner)


async def test_an_applied_request_keeps_a_pending_dvu_pending() -> None:
    cs = _change_set()
    decision = await _handler(cs, FakeApp(dvu=False)).decide(
        _msg(cs, _request(cs)), 1, _record(dvu_pending=True), unclean=False
    )
    assert decision.kind is Kind.APPLIED and decision.dvu is False
    assert decision.record is not None and decision.record.dvu_pending is True


async def test_a_request_without_a_reply_inbox_is_applied_with_nowhere_to_answer() -> None:
    cs = _change_set()
    decision = await _handler(cs, FakeApp()).decide(
        _msg(cs, _request(cs), inbox=None), 1, _record(), unclean=False
    )
    assert decision.kind is Kind.APPLIED and decision.inbox is None and decision.response is not None


async def test_a_conflicts_reply_is_applied_as_it_is() -> None:
    cs = _change_set()
    status = ConflictsStatus(conflicts=[Conflict(path="/a", expected_version="1", actual_version="2")])

    class Conflicting(FakeApp):
        async def apply(
            self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest
        ) -> Applied:
            return Applied(status, state)

    request = _request(cs)
    decision = await _handler(cs, Conflicting()).decide(_msg(cs, request), 1, _record(), unclean=False)
    assert decision.kind is Kind.APPLIED and decision.dead_letter is None
    assert decision.response is not None and decision.response.status == status
    assert decision.record is not None and decision.record.recorded_status(str(request.id)) == status


# -- failures ---------------------------------------------------------------------------------------------------


async def test_an_unprocessable_request_gets_an_error_reply_and_a_dead_letter() -> None:
    cs = _change_set()
    app = FakeApp(fail=UnprocessableError("no such path"))
    request = _request(cs)
    decision = await _handler(cs, app).decide(_msg(cs, request), 4, _record(applied_seq=3), unclean=False)
    assert decision.kind is Kind.APPLIED and decision.processed
    # Where in the app it was raised is said too (this file's FakeApp.apply).
    assert decision.dead_letter is not None
    assert re.fullmatch(
        r"UnprocessableError: no such path \(at test_request_handling\.py:\d+ in apply\)",
        decision.dead_letter,
    )
    assert decision.trace is not None and decision.trace.endswith("in apply")
    status = _error(decision)
    assert status.message == decision.dead_letter and status.retryable is False
    assert decision.record is not None and decision.record.applied_seq == 4
    assert decision.record.state == {"applied": []}  # unchanged
    # Remembered: a redelivery is answered with the same error, not run again (its details are not kept: a daemon
    # of an earlier release may read the record; the message says the same).
    assert status.details is not None and status.details.raised_at is not None
    assert status.details.raised_at.startswith("test_request_handling.py:")
    assert decision.record.recorded_status(str(request.id)) == status.model_copy(update={"details": None})
    assert len(app.calls) == 1


@pytest.mark.parametrize("failure", [RetryableError("busy"), RuntimeError("bug in the app")])
async def test_a_retryable_failure_counts_an_attempt_and_retries_with_backoff(failure: Exception) -> None:
    cs = _change_set()
    settings = _settings(max_attempts=5, retry_backoff=0.1, retry_backoff_max=0.3)
    handler = _handler(cs, FakeApp(fail=failure), settings)
    request = _request(cs)
    msg = _msg(cs, request)
    record = _record(applied_seq=1)
    delays = []
    for attempt in (1, 2, 3):
        decision = await handler.decide(msg, 2, record, unclean=False)
        assert decision.kind is Kind.RETRY and not decision.processed
        assert decision.response is None and decision.dead_letter is None
        assert decision.record is not None
        assert decision.record.attempts == {str(request.id): attempt}
        assert decision.record.applied_seq == 1  # stays first in line
        assert isinstance(decision.error, Retry) and decision.error.__cause__ is failure
        assert f"attempt {attempt} of request {request.id}" in str(decision.error)
        delays.append(decision.error.delay)
        record = decision.record
    assert delays == pytest.approx([0.1, 0.2, 0.3])  # doubling, capped at retry_backoff_max


async def test_a_request_failing_max_attempts_times_gets_an_error_reply_and_a_dead_letter() -> None:
    cs = _change_set()
    handler = _handler(cs, FakeApp(fail=RetryableError("still busy")), _settings(max_attempts=3))
    request = _request(cs)
    record = _record(applied_seq=1, attempts={str(request.id): 2})
    decision = await handler.decide(_msg(cs, request), 2, record, unclean=False)
    assert decision.kind is Kind.APPLIED and decision.processed and decision.error is None
    assert decision.dead_letter is not None
    assert re.fullmatch(
        r"gave up after 3 attempts: RetryableError: still busy \(at test_request_handling\.py:\d+ in apply\)",
        decision.dead_letter,
    )
    assert _error(decision).message == decision.dead_letter and not _error(decision).retryable
    assert decision.inbox == INBOX
    assert decision.record is not None and decision.record.applied_seq == 2
    assert str(request.id) not in decision.record.attempts
    error = _error(decision)
    assert error.details is not None and error.details.error_class == "RetryableError"
    # Remembered without its details (see the test above).
    assert decision.record.recorded_status(str(request.id)) == error.model_copy(update={"details": None})


async def test_a_wedged_step_is_retried_as_wedged() -> None:
    cs = _change_set()
    wedged = Wedged("overran handler_deadline")
    request = _request(cs)
    decision = await _handler(cs, FakeApp(fail=wedged)).decide(_msg(cs, request), 1, _record(), unclean=False)
    assert decision.kind is Kind.RETRY and decision.error is wedged
    assert decision.record is not None and decision.record.attempts == {str(request.id): 1}


@pytest.mark.parametrize("failure", [FencedError("taken over"), LeaseLost()])
async def test_losing_the_change_set_during_apply_is_raised_not_decided(failure: Exception) -> None:
    cs = _change_set()
    with pytest.raises(type(failure)):
        await _handler(cs, FakeApp(fail=failure)).decide(_msg(cs, _request(cs)), 1, _record(), unclean=False)


# -- processed() -------------------------------------------------------------------------------------------------


def test_processed_moves_the_watermark_forward_only_and_settles_a_suspicion_of_the_request() -> None:
    record = _record(applied_seq=5, suspect=(6, 2))
    assert processed(record, 6).applied_seq == 6 and processed(record, 6).suspect is None
    assert processed(record, 3).applied_seq == 5  # never backwards
    assert processed(record, 3).suspect == (6, 2)  # a suspicion of a later request stays
