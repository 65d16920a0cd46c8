"""The quiet rule (rebaser_server.changeset.quiet), the failure outcomes (outcome.failed) and the group commit rule
(group.commit_now): the processor's decisions, without NATS."""

from __future__ import annotations

import nats.errors
import pytest

from rebaser_core.errors import FencedError
from rebaser_server.changeset.group import GROUP_MAX, commit_now
from rebaser_server.changeset.outcome import LeaseLost, Outcome, Retry, Wedged, failed
from rebaser_server.changeset.quiet import PRESSURE_QUIET, Look, look, may_give_way, release_after

QUIET, NATS_TIMEOUT = 5.0, 10.0


def _look(
    idle: float, *, caught_up: bool = True, giving_way: bool = False, request_in_hand: bool = False
) -> Look:
    return look(
        idle,
        quiescent_period=QUIET,
        nats_timeout=NATS_TIMEOUT,
        caught_up=caught_up,
        giving_way=giving_way,
        request_in_hand=request_in_hand,
    )


def test_a_caught_up_change_set_lets_go_after_the_quiet_period() -> None:
    assert _look(QUIET - 1).release is None
    assert _look(QUIET).release == "quiescent"
    assert _look(QUIET + 100).release == "quiescent"


def test_before_the_quiet_period_it_looks_again_when_it_ends() -> None:
    step = _look(QUIET - 1.5)
    assert step.release is None and not step.after_request
    assert step.wait == pytest.approx(1.5, abs=0.01)
    # Never more than a quiet period ahead, and always a little past the limit (no wake-up a hair short of it).
    assert _look(0).wait == pytest.approx(QUIET, abs=0.01) and _look(0).wait > QUIET


def test_others_waiting_shorten_the_limit_of_a_caught_up_change_set() -> None:
    assert release_after(QUIET, NATS_TIMEOUT, caught_up=True, giving_way=True) == PRESSURE_QUIET
    assert _look(PRESSURE_QUIET, giving_way=True).release == "others wait for a slot"
    assert _look(PRESSURE_QUIET - 0.5, giving_way=True).wait == pytest.approx(0.5, abs=0.01)
    # A quiet period shorter than the pressure limit stays the limit.
    assert release_after(0.5, NATS_TIMEOUT, caught_up=True, giving_way=True) == 0.5


def test_a_change_set_not_caught_up_waits_for_its_consumer_much_longer() -> None:
    limit = release_after(QUIET, NATS_TIMEOUT, caught_up=False, giving_way=True)
    assert limit == max(2 * QUIET, NATS_TIMEOUT)
    assert release_after(QUIET, 60.0, caught_up=False, giving_way=False) == 60.0
    assert _look(QUIET + 1, caught_up=False, giving_way=True).release is None
    reason = _look(limit, caught_up=False).release
    assert reason is not None and "queued" in reason


def test_a_request_in_hand_is_never_released_under_it() -> None:
    step = _look(QUIET + 1, request_in_hand=True)
    assert step.release is None and step.after_request and step.wait == QUIET
    assert _look(QUIET - 1, request_in_hand=True).after_request is False  # not due yet: an ordinary wait


def test_the_watchdog_wakes_only_a_caught_up_change_set_idle_long_enough() -> None:
    assert may_give_way(PRESSURE_QUIET, caught_up=True)
    assert not may_give_way(PRESSURE_QUIET - 0.01, caught_up=True)
    assert not may_give_way(PRESSURE_QUIET * 10, caught_up=False)


@pytest.mark.parametrize(
    ("err", "outcome", "delay"),
    [
        (FencedError("taken over"), Outcome.FENCED, 0.0),
        (LeaseLost(), Outcome.LEASE_LOST, 0.0),
        (Retry(7.0, "try later"), Outcome.RETRY, 7.0),
        (Wedged(), Outcome.WEDGED, 0.0),
        (nats.errors.TimeoutError(), Outcome.RETRY, 0.25),
        (TimeoutError(), Outcome.RETRY, 0.25),
        (KeyError("a bug"), Outcome.RETRY, 0.25),
    ],
)
def test_every_failure_ends_the_task_one_typed_way(err: Exception, outcome: Outcome, delay: float) -> None:
    result = failed(err, retry_backoff=0.25)
    assert (result.outcome, result.delay) == (outcome, delay)
    assert result.reason
    assert not result.outcome.hands_back or outcome in (Outcome.RETRY, Outcome.WEDGED)


def test_a_group_grows_only_while_more_requests_wait_and_it_has_room() -> None:
    window = 1000
    assert commit_now(1, 0, one_by_one=False, idempotency_window=window)  # nothing behind it
    assert not commit_now(1, 5, one_by_one=False, idempotency_window=window)
    assert commit_now(GROUP_MAX, 5, one_by_one=False, idempotency_window=window)  # full
    # Never more than half the idempotency window in one group (the trimmer's bound).
    assert commit_now(4, 5, one_by_one=False, idempotency_window=8)
    assert not commit_now(3, 5, one_by_one=False, idempotency_window=8)
    # After an unclean takeover every request is committed on its own.
    assert commit_now(1, 5, one_by_one=True, idempotency_window=window)
