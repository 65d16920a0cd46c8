"""A cancel that Python 3.11 loses on the way, raised where a background loop next waits.

On Python 3.11 ``asyncio.wait_for`` returns its future's result instead of raising when that result and a
``Task.cancel()`` arrive in the same step (fixed in 3.12). nats-py waits for every request's answer with it. So a
background loop cancelled just as a NATS answer comes in goes on as if nothing had happened, and whatever waits for
it to end waits out the loop's next sleep, or for ever if the loop only ends by being cancelled. (The fair intake's
stop waited 3 s in about one test daemon out of two this way.)

The task still counts the cancel it was sent (``Task.cancelling()``), so a loop can raise it itself: background
loops sleep with :func:`sleep`, or call :func:`raise_lost_cancel` at the top of each pass. Not for waits in a
cancelled task's clean-up (a retry in a ``finally``): there the cancel was delivered, and is still counted.
"""

from __future__ import annotations

import asyncio

__all__ = ["raise_lost_cancel", "sleep"]


def raise_lost_cancel() -> None:
    """Raise ``CancelledError`` if this task was cancelled and the cancel never reached it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def sleep(delay: float) -> None:
    """``asyncio.sleep`` for a background loop: a cancel this task was sent but lost is raised first."""
    raise_lost_cancel()
    await asyncio.sleep(delay)
