"""An application's bug made visible: each failed attempt at a request is logged once, at WARNING, with the
exception's traceback (the file and line in the app), at most once a period per change set, so that a request
that fails again and again cannot flood the log. The rest are counted and said in the next line that is logged.
The error reply and the dead letter say where the exception was raised (:func:`raised_at`, :func:`app_trace`).

The request's data is never logged: the traceback shows code, and the message is the one the error reply carries.
"""

from __future__ import annotations

import logging
import os
import sysconfig
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable

from rebaser_server.app import ChangeSet

__all__ = ["AppFailureLog", "app_failures", "app_trace", "raised_at"]

log = logging.getLogger(__name__)


class AppFailureLog:
    """At most one logged failure per change set every ``period`` seconds, for up to ``tracked`` change sets (the
    longest quiet ones are forgotten first)."""

    def __init__(
        self,
        period: float = 60.0,
        tracked: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._period = period
        self._tracked = tracked
        self._clock = clock
        self._last: OrderedDict[ChangeSet, tuple[float, int]] = OrderedDict()  # logged at, suppressed since

    def failed(
        self, change_set: ChangeSet, request_id: str, attempt: int, max_attempts: int, err: BaseException
    ) -> bool:
        """Log ``err`` for this attempt unless one was logged for ``change_set`` within the period; True if
        logged."""
        now = self._clock()
        logged_at, suppressed = self._last.get(change_set, (None, 0))
        if logged_at is not None and now - logged_at < self._period:
            self._last[change_set] = (logged_at, suppressed + 1)
            return False
        self._last[change_set] = (now, 0)
        self._last.move_to_end(change_set)
        while len(self._last) > self._tracked:
            self._last.popitem(last=False)
        outcome = "gave up" if attempt >= max_attempts else "will retry"
        more = f"; {suppressed} more failures since the last one logged" if suppressed else ""
        log.warning(
            "%s: the app failed on request %s, attempt %d of %d (%s)%s: %s: %s",
            change_set,
            request_id,
            attempt,
            max_attempts,
            outcome,
            more,
            type(err).__name__,
            err,
            exc_info=err,
        )
        return True


# One for the daemon: a change set's attempts may be made by successive tasks (and handlers) in one process.
app_failures = AppFailureLog()


# Frames of these are the daemon's or Python's, not the app's: left out of where an app's exception was raised.
_OURS = tuple(
    os.path.dirname(__import__(name).__file__ or "") + os.sep for name in ("rebaser_server", "rebaser_core")
)
_STDLIB = tuple(
    path + os.sep for path in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]} if path
)
_TRACE_FRAMES = 8


def _app_frames(err: BaseException) -> list[traceback.FrameSummary]:
    frames = traceback.extract_tb(err.__traceback__)
    return [f for f in frames if not f.filename.startswith(_OURS)]


def _where(frame: traceback.FrameSummary) -> str:
    return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"


def raised_at(err: BaseException) -> str | None:
    """Where in the app ``err`` was raised, ``file.py:42 in apply``: the innermost frame that is neither the
    daemon's nor the standard library's (a ``KeyError`` from a ``dict`` lookup points at the lookup). None if the
    app has no frame in it (the built-in apps are the daemon's own)."""
    frames = _app_frames(err)
    own = [f for f in frames if not f.filename.startswith(_STDLIB)]
    chosen = own or frames
    return _where(chosen[-1]) if chosen else None


def app_trace(err: BaseException) -> str | None:
    """The app's frames of ``err``'s traceback, the outermost first, ``app.py:10 in apply > prices.py:3 in price``
    (the innermost :data:`_TRACE_FRAMES`): code locations only, never values. None if the app has none."""
    frames = _app_frames(err)[-_TRACE_FRAMES:]
    return " > ".join(_where(f) for f in frames) or None
