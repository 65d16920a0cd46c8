"""Testing tools (public API): force interleavings at named checkpoints and run daemons in-process.

A race is proven by forcing it, not by sleeping and hoping::

    gate = CheckpointGate("stopped_consuming")
    async with running_daemon(nc, settings, app, hooks=gate):
        ...                       # make the daemon quiesce
        await gate.wait_reached()  # it is paused between "stopped consuming" and "task acked"
        ...                       # act inside the window
        gate.release()
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from nats.aio.client import Client as NatsClient

from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet, RebaserApp
from rebaser_server.hooks import CHECKPOINTS, Hooks
from rebaser_server.server import Daemon

__all__ = ["CheckpointGate", "RecordingHooks", "fast_settings", "running_daemon"]


def _known(name: str) -> str:
    if name not in CHECKPOINTS:
        raise ValueError(f"unknown checkpoint {name!r}; known: {', '.join(CHECKPOINTS)}")
    return name


class CheckpointGate(Hooks):
    """Pauses the daemon the next time it reaches checkpoint ``name``, until :meth:`release`.

    ``arm()`` makes it pause once more (for loops that force the same interleaving many times).
    """

    def __init__(self, name: str) -> None:
        self.name = _known(name)
        self.change_set: ChangeSet | None = None
        self._armed = True
        self._reached = asyncio.Event()
        self._released = asyncio.Event()

    def arm(self, name: str | None = None) -> None:
        """Pause once more, at ``name`` if given (else at the same checkpoint)."""
        if name is not None:
            self.name = _known(name)
        self._armed = True
        self._reached.clear()
        self._released.clear()

    async def wait_reached(self, timeout: float = 10.0) -> ChangeSet:
        async with asyncio.timeout(timeout):
            await self._reached.wait()
        assert self.change_set is not None
        return self.change_set

    def release(self) -> None:
        self._released.set()

    async def checkpoint(self, name: str, change_set: ChangeSet) -> None:
        if name == self.name and self._armed:
            self._armed = False
            self.change_set = change_set
            self._reached.set()
            await self._released.wait()


class RecordingHooks(Hooks):
    """Records every checkpoint reached, in order, as ``(name, change_set)``."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ChangeSet]] = []

    async def checkpoint(self, name: str, change_set: ChangeSet) -> None:
        self.events.append((name, change_set))

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.events if n == name)


def fast_settings(prefix: str | None, **overrides: object) -> Settings:
    """Settings with periods shrunk for tests (quiet after 0.5 s, ack_wait 3 s, sweep every 1 s)."""
    values: dict[str, object] = {
        "prefix": prefix,
        "storage": "memory",
        "ack_wait": 3.0,
        "progress_period": 0.5,
        "quiescent_period": 0.5,
        "handler_deadline": 10.0,
        "sweep_interval": 1.0,
        "retry_backoff": 0.1,
        "retry_backoff_max": 0.5,
        "shutdown_grace": 5.0,
    }
    values.update(overrides)
    return Settings.model_validate(values)


@asynccontextmanager
async def running_daemon(
    nc: NatsClient, settings: Settings, app: RebaserApp, *, hooks: Hooks | None = None, sweep: bool = True
) -> AsyncIterator[Daemon]:
    """A started in-process daemon, shut down gracefully on exit."""
    daemon = Daemon(nc, settings, app, hooks=hooks, sweep=sweep)
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.shutdown()
