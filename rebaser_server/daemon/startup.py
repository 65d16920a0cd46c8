"""Starting a daemon's parts, and stopping them within a bound.

Setting a daemon up while its cluster may still be forming is retried with backoff, each failure one log line.

Every daemon sets up at start-up, often all at once: on a fresh cluster nats-server leaves the losing concurrent
stream creates unanswered (a timeout), and a stream leader still being elected leaves any JetStream call
unanswered, the app's own (the snapshot app opens an object store) included. So a failure here is retried, not
fatal. Retrying is safe: each step is create-or-update, and an app whose start failed is stopped (releasing what it
opened) before it is started again.

An unreadable layout entry (:class:`~rebaser_core.errors.LayoutUnreadable`) is waited out the same way, though it
is no NATS trouble: it needs an operator's repair (``rebaser streams repair``). A daemon that exited instead would
only restart into the same error; one that waits says what is wrong on ``/readyz`` and ``/status`` (the problem is
kept by :class:`~rebaser_server.daemon.shards.ShardPullers`) and in one error line, and starts once it is repaired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js.errors import APIError

from rebaser_core.errors import LayoutUnreadable
from rebaser_core.settings import Settings
from rebaser_server.app import RebaserApp

__all__ = ["set_up_with_retries", "start_app", "stop_task", "unavailable"]

log = logging.getLogger(__name__)

# The first pause between tries, and the cap of the doubling pauses.
_RETRY_FIRST = 0.2
_RETRY_MAX = 5.0
_SERVICE_UNAVAILABLE = 503
_UNAVAILABLE = (
    TimeoutError
    | ConnectionError
    | nats.errors.NoRespondersError
    | nats.errors.ConnectionClosedError
    | nats.errors.ConnectionReconnectingError
    | nats.errors.StaleConnectionError
    | nats.errors.OutboundBufferLimitError
    | nats.errors.NoServersError
)


def unavailable(err: BaseException) -> bool:
    """A failure that says NATS or JetStream is not available yet (no answer, no responder, no leader, no
    connection), as opposed to a refusal that retrying cannot change."""
    if isinstance(err, APIError):
        return err.code == _SERVICE_UNAVAILABLE
    return isinstance(err, _UNAVAILABLE)


async def set_up_with_retries(
    prepare: Callable[[], Awaitable[None]],
    start_app: Callable[[], Awaitable[None]] | None = None,
    *,
    timeout: float | None,
    stopping: Callable[[], bool],
) -> None:
    """``prepare`` (streams, layout, store), then ``start_app`` (if any), tried again while NATS is not available
    yet, for ``timeout`` seconds (None: for ever) or until ``stopping()``. The app's own refusal (a bad config, a
    file it cannot open) is not retried."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    pause = _RETRY_FIRST
    told = False  # the unreadable layout was logged
    while not stopping():
        app_step = False
        try:
            await prepare()
            if stopping():
                return  # shut down meanwhile: start no app that shutdown would not stop
            app_step = True
            if start_app is not None:
                await start_app()
            return
        except (nats.errors.Error, TimeoutError, OSError, LayoutUnreadable) as err:
            if deadline is not None and loop.time() + pause > deadline:
                raise
            if app_step and not unavailable(err):
                raise
            if isinstance(err, LayoutUnreadable):
                # Said once as an error; then only /readyz and /status say it, not a line every 5 s.
                log.log(logging.DEBUG if told else logging.ERROR, "%s; waiting for it to be repaired", err)
                told = True
            else:
                log.warning(
                    "JetStream set-up failed (%s: %s); retrying in %.1fs",
                    type(err).__name__,
                    err or "no answer",
                    pause,
                )
            await asyncio.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, _RETRY_MAX)


async def start_app(
    app: RebaserApp, nc: NatsClient, settings: Settings, *, stopping: Callable[[], bool]
) -> None:
    """Start the app; an app whose start fails is stopped (releasing what it opened) so it can be started again.
    ``stopping``: shutdown has come to stopping the app, whose stop may have run before this start ended."""
    try:
        await app.start(nc, settings)
    except BaseException:
        with contextlib.suppress(Exception):
            await app.stop()
        raise
    if stopping():
        with contextlib.suppress(Exception):
            await app.stop()


async def stop_task(task: asyncio.Task[Any], *, grace: float, after_cancel: float) -> None:
    """Let ``task`` end by itself within ``grace``, else cancel it and wait at most ``after_cancel`` more."""
    if grace > 0:
        await asyncio.wait({task}, timeout=grace)
    if not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=after_cancel)
    if not task.done():
        log.error(
            "%s did not stop within %.1fs of being cancelled; left behind", task.get_name(), after_cancel
        )
