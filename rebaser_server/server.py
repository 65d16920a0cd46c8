"""The daemon: take tasks from the shared consumer, run one processor per owned change set, shut down cleanly.

Back-pressure starts here: the daemon only fetches as many tasks as it has free slots (``Settings.concurrency``);
with every slot taken it stops pulling, and waiting tasks stay in the stream, not in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.errors import FetchTimeoutError

from rebaser_core.errors import InvalidSubject
from rebaser_core.ids import RequestId
from rebaser_core.settings import Settings
from rebaser_core.streams import ensure_streams
from rebaser_server.app import ChangeSet, RebaserApp
from rebaser_server.hooks import Hooks
from rebaser_server.processor import ChangeSetProcessor, Outcome, TaskResult
from rebaser_server.queries import QueryService
from rebaser_server.runtime import Runtime, Stats
from rebaser_server.state import ChangeSetStore
from rebaser_server.sweeper import Sweeper

__all__ = ["Daemon"]

log = logging.getLogger(__name__)

# A pending pull request is answered within this long even when idle, so shutdown never waits longer to stop
# pulling (and never leaves a pull request open that could hand us a task after we stopped).
_FETCH_TIMEOUT = 1.0
_FETCH_BATCH = 64


class Daemon:
    """One rebaser daemon on an open NATS connection.

    ``await daemon.start()`` sets up streams, the tasks consumer, the change-set store and the app, then pulls
    tasks in the background; ``await daemon.shutdown()`` hands every owned change set back and stops.
    """

    def __init__(
        self,
        nc: NatsClient,
        settings: Settings,
        app: RebaserApp,
        *,
        owner: str | None = None,
        hooks: Hooks | None = None,
        sweep: bool = True,
    ) -> None:
        js = nc.jetstream(timeout=max(5.0, settings.ack_wait / 2))
        owner = owner or f"{socket.gethostname()}:{os.getpid()}:{RequestId.new()}"
        self.rt = Runtime(nc, js, settings, app, ChangeSetStore(js, settings), owner, hooks or Hooks())
        self.sweeper = Sweeper(self.rt)
        self.queries = QueryService(self.rt)
        self._sweep = sweep
        self._active: dict[asyncio.Task[None], ChangeSetProcessor] = {}
        self._slot_freed = asyncio.Event()
        self._stopping = False
        self._puller: asyncio.Task[None] | None = None
        self._pull_sub: Any = None
        self._sweeper_task: asyncio.Task[None] | None = None
        self.stopped = asyncio.Event()

    @property
    def stats(self) -> Stats:
        return self.rt.stats

    @property
    def owned(self) -> list[ChangeSet]:
        return [p.change_set for p in self._active.values()]

    async def start(self) -> None:
        rt = self.rt
        await ensure_streams(rt.js, rt.settings)
        await rt.store.open()
        await rt.app.start(rt.nc, rt.settings)
        await self.queries.start()
        self._pull_sub = await rt.js.pull_subscribe_bind(rt.subjects.tasks_consumer, rt.subjects.tasks_stream)
        self._puller = asyncio.create_task(self._pull(self._pull_sub), name="rebaser task puller")
        if self._sweep:
            self._sweeper_task = asyncio.create_task(self.sweeper.run(), name="rebaser orphan sweep")
        log.info(
            "rebaser daemon %s serving (prefix=%s, concurrency=%d)",
            rt.owner,
            rt.settings.prefix,
            rt.settings.concurrency,
        )

    async def _pull(self, sub: Any) -> None:
        settings = self.rt.settings
        while not self._stopping:
            free = settings.concurrency - len(self._active)
            if free <= 0:
                # Every slot is taken: stop pulling until a change set is released.
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            try:
                msgs: list[Msg] = await sub.fetch(batch=min(free, _FETCH_BATCH), timeout=_FETCH_TIMEOUT)
            except (TimeoutError, FetchTimeoutError):
                continue
            except Exception as err:
                if self._stopping:
                    break
                log.warning("fetching tasks failed (%s); retrying", err)
                await asyncio.sleep(_FETCH_TIMEOUT)
                continue
            for msg in msgs:
                if self._stopping:
                    await msg.nak()  # fetched during shutdown: hand it straight back
                else:
                    await self._take(msg)

    async def _take(self, msg: Msg) -> None:
        try:
            parsed = self.rt.subjects.parse_task(msg.subject)
        except InvalidSubject as err:
            log.error("dropping malformed task %r: %s", msg.subject, err)
            await msg.term()
            return
        self.rt.stats.tasks_taken += 1
        processor = ChangeSetProcessor(self.rt, ChangeSet(parsed.workspace_id, parsed.change_set_id), msg)
        task = asyncio.create_task(self._own(processor, msg), name=f"change set {processor.change_set}")
        self._active[task] = processor

    async def _own(self, processor: ChangeSetProcessor, msg: Msg) -> None:
        stats = self.rt.stats
        try:
            try:
                result = await processor.run()
            except Exception as err:
                log.exception("%s: task failed", processor.change_set)
                result = TaskResult(Outcome.RETRY, self.rt.settings.retry_backoff, str(err))
            log.debug("%s: task %s (%s)", processor.change_set, result.outcome.value, result.reason)
            if result.outcome is Outcome.RELEASED:
                stats.tasks_released += 1
            elif result.outcome is Outcome.FENCED:
                stats.tasks_fenced += 1  # the new owner holds the task: neither ack nor nack it
            else:
                delay = result.delay if result.outcome is Outcome.RETRY else None
                with contextlib.suppress(Exception):
                    await msg.nak(delay=delay)
                if result.outcome is Outcome.RETRY:
                    stats.tasks_retried += 1
                elif result.outcome is Outcome.INTERRUPTED:
                    stats.tasks_interrupted += 1
                else:
                    stats.tasks_wedged += 1
        finally:
            self._active.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
            self._slot_freed.set()

    async def shutdown(self) -> None:
        """Stop taking tasks, finish the requests in hand (bounded), nack owned tasks so others take them now."""
        if self._stopping:
            await self.stopped.wait()
            return
        self._stopping = True
        self._slot_freed.set()
        if self._puller is not None:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._puller, timeout=_FETCH_TIMEOUT * 3)
        if self._pull_sub is not None:
            # Status messages of expired pulls can sit unread in its queue, and would stall the connection's drain.
            with contextlib.suppress(Exception):
                await self._pull_sub.unsubscribe()
        if self._sweeper_task is not None:
            self._sweeper_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper_task
        for processor in list(self._active.values()):
            processor.interrupt()
        if self._active:
            await asyncio.wait(set(self._active), timeout=self.rt.settings.shutdown_grace + 5.0)
        with contextlib.suppress(Exception):
            await self.queries.stop()
        with contextlib.suppress(Exception):
            await self.rt.app.stop()
        self.stopped.set()
        log.info("rebaser daemon %s stopped", self.rt.owner)
