"""How one change-set task ends, and what the daemon then does with the task delivery."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rebaser_core.errors import FencedError

__all__ = ["TASK_COUNTERS", "LeaseLost", "Outcome", "Retry", "TaskResult", "Wedged", "failed"]


class Outcome(enum.Enum):
    RELEASED = "released"  # quiet: task acked
    RETRY = "retry"  # retryable failure: nack with delay
    INTERRUPTED = "interrupted"  # shutdown or reconnect: nack now
    WEDGED = "wedged"  # a step overran handler_deadline: nack now
    # The three below touch the delivery in no way (no ack, no nack): someone else holds the task, or may.
    FENCED = "fenced"  # another daemon took the change set over
    LEASE_LOST = (
        "lease_lost"  # the lease ran out (paused, partitioned, slow): the server may have redelivered
    )
    STALE = "stale"  # the delivery was already stale when taken (it waited in a paused daemon's buffer)
    PAUSED = (
        "paused"  # the change set is paused: let go (task acked), nothing more applied until it is resumed
    )

    @property
    def hands_back(self) -> bool:
        """Nack the delivery (if the lease is still held) so another daemon can take it at once."""
        return self in (Outcome.RETRY, Outcome.INTERRUPTED, Outcome.WEDGED)


# The daemon's counter (a ``Stats`` field) of each way a task ends.
TASK_COUNTERS = {
    Outcome.RELEASED: "tasks_released",
    Outcome.FENCED: "tasks_fenced",  # the new owner holds the task: neither ack nor nak it
    Outcome.LEASE_LOST: "tasks_lease_lost",
    Outcome.STALE: "tasks_stale",
    Outcome.RETRY: "tasks_retried",
    Outcome.INTERRUPTED: "tasks_interrupted",
    Outcome.WEDGED: "tasks_wedged",
    Outcome.PAUSED: "tasks_paused",
}


@dataclass(frozen=True, slots=True)
class TaskResult:
    outcome: Outcome
    delay: float = 0.0
    reason: str = ""


class Retry(Exception):
    """A retryable failure: end the task and have it redelivered after ``delay``."""

    def __init__(self, delay: float, reason: str) -> None:
        super().__init__(reason)
        self.delay = delay


class Wedged(Exception):
    """A step was cancelled by the watchdog (it overran handler_deadline)."""


class LeaseLost(Exception):
    """The lease on the task ran out: stop at once, touch nothing."""


class PauseNow(Exception):
    """A request failed ``max_attempts`` times under ``on_max_attempts = "pause"``: pause the change set (the
    request stays first in line) and let it go."""

    def __init__(self, request_id: str, reason: str) -> None:
        super().__init__(reason)
        self.request_id = request_id


def failed(err: Exception, retry_backoff: float) -> TaskResult:
    """How a task ends after ``err`` while one of its requests was processed: the typed failures end it their own
    way; anything else (NATS or KV trouble, a bug) is retried after ``retry_backoff``, the request still first in
    line."""
    if isinstance(err, FencedError):
        return TaskResult(Outcome.FENCED, reason=str(err))
    if isinstance(err, LeaseLost):
        return TaskResult(Outcome.LEASE_LOST, reason="lease ran out during a step")
    if isinstance(err, Retry):
        return TaskResult(Outcome.RETRY, err.delay, str(err))
    if isinstance(err, Wedged):
        return TaskResult(Outcome.WEDGED, reason="request handler overran handler_deadline")
    if isinstance(err, PauseNow):
        return TaskResult(Outcome.PAUSED, reason=str(err))
    return TaskResult(Outcome.RETRY, retry_backoff, f"{type(err).__name__}: {err}")
