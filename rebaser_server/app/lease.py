"""How long the running step's change set is sure to stay this daemon's, for an app with side effects.

The daemon checks its lease on the change set right before each app step, with no wait in between. But a process
can stall anywhere (a SIGSTOP, a long GC pause, a virtual machine its host froze): a step that began under a good
lease may run on after another daemon took the change set over. Its *commit* is fenced, so its state is never
written; a side effect outside the state is not. :func:`lease_deadline` tells an app, inside ``apply`` or
``dependent_values_update``, until when the check made before the step found the lease sure to hold.
"""

from __future__ import annotations

import contextvars
import time

__all__ = ["lease_deadline", "lease_left", "step_deadline"]

# Set by the daemon around each step (rebaser_server/changeset/steps.py), in the step's own copy of the context.
step_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "rebaser_step_deadline", default=None
)


def lease_deadline() -> float | None:
    """The ``time.monotonic()`` until which the change set of the running step is sure to be this daemon's, as
    checked right before the step began; None outside a step."""
    return step_deadline.get()


def lease_left() -> float | None:
    """Seconds left before :func:`lease_deadline` (negative once past it: skip an external side effect, and
    raise ``RetryableError``); None outside a step."""
    deadline = step_deadline.get()
    return None if deadline is None else deadline - time.monotonic()
