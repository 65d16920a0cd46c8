"""The ``settled`` query: hold the reply until a change set has nothing queued and no DVU due.

Any daemon of the query group answers, owner or not: whether a change set is settled is read from JetStream, not
from memory. Settled means: the last request stored for it is at or below its record's watermark (``applied_seq``;
processed requests still waiting for their purge count as done) and no DVU is due, or one is due but nothing owns
the change set (no task), so nothing would run it before the next request (a DVU that kept failing at release).

The wait does not poll in a loop: it subscribes (core NATS) to the record's own KV subject, ``$KV.<bucket>.<key>``,
before looking, and looks again on every write of the record (each processed request group and each DVU commits
one), coalesced, plus once every ``_RECHECK`` seconds for what changes without a record write (an operator's purge,
a task acked). Each wait is a task of its own (a query callback must not hold the subscription), bounded in number.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from nats.aio.subscription import Subscription
from nats.js.errors import NotFoundError

from rebaser_core.api import (
    MAX_SETTLED_WAIT,
    WAIT_SETTLED_RESPONSE,
    ContentType,
    WaitSettledRequest,
    WaitSettledResponse,
)
from rebaser_core.ids import RequestId
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.runtime import Runtime

__all__ = ["SettledWaits", "settled_now"]

log = logging.getLogger(__name__)

# Look again at least this often even without a record write (what can change without one is rare).
_RECHECK = 1.0
# Waits one daemon holds at once; beyond it a wait is answered with an error at once (the caller asks again).
MAX_WAITS = 10_000
STOPPING = "the daemon answering stopped; ask again"


async def settled_now(rt: Runtime, change_set: ChangeSet, query_id: RequestId) -> WaitSettledResponse:
    """The change set's settled facts as of now (from the record, the requests stream and the tasks stream)."""
    wk, cs = change_set.workspace_id, change_set.change_set_id
    record = await rt.store.read(change_set)
    applied = record.applied_seq if record else 0
    try:
        # From the stream leader: a request the caller stored just before asking must be seen.
        last = await rt.js.get_last_msg(rt.subjects.requests_stream, rt.subjects.requests(wk, cs))
        queued = int(last.seq or 0) > applied
    except NotFoundError:
        queued = False
    try:
        await rt.js.get_last_msg(rt.subjects.tasks_stream, rt.subjects.task(wk, cs), direct=True)
        owned = True
    except NotFoundError:
        owned = False
    dvu = bool(record and record.dvu_pending)
    return WaitSettledResponse(
        id=query_id,
        workspace_id=wk,
        change_set_id=cs,
        settled=not queued and (not dvu or not owned),
        queued=queued,
        dvu_pending=dvu,
        owned=owned,
        applied_seq=applied,
    )


class SettledWaits:
    """The settled queries this daemon holds."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._waits: set[asyncio.Task[None]] = set()

    @property
    def held(self) -> int:
        """Waits held now."""
        return len(self._waits)

    def start(
        self, reply: str, change_set: ChangeSet, request: WaitSettledRequest, content_type: ContentType
    ) -> None:
        """Answer ``request`` on ``reply`` once the change set is settled or the wait is over (in the background)."""
        if len(self._waits) >= MAX_WAITS:
            response = WaitSettledResponse(
                id=request.id,
                workspace_id=change_set.workspace_id,
                change_set_id=change_set.change_set_id,
                error=f"this daemon already holds {MAX_WAITS} settled waits; ask again",
            )
            task = asyncio.create_task(self._answer(reply, response, content_type))
        else:
            task = asyncio.create_task(
                self._wait(reply, change_set, request, content_type), name=f"settled {change_set}"
            )
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)

    async def stop(self) -> None:
        """Answer every held wait with an error saying to ask again (another daemon will answer it)."""
        waits = list(self._waits)
        for task in waits:
            task.cancel()
        if waits:
            await asyncio.wait(waits, timeout=self._rt.settings.nats_timeout)

    async def _wait(
        self, reply: str, change_set: ChangeSet, request: WaitSettledRequest, content_type: ContentType
    ) -> None:
        rt = self._rt
        changed = asyncio.Event()

        async def on_write(_: Any) -> None:
            changed.set()

        key = Subjects.change_set_key(change_set.workspace_id, change_set.change_set_id)
        sub: Subscription | None = None
        deadline = time.monotonic() + min(request.timeout, MAX_SETTLED_WAIT)
        response: WaitSettledResponse | None = None
        try:
            # Subscribed before the first look, so no write between the look and the wait is missed.
            sub = await rt.nc.subscribe(f"$KV.{rt.subjects.change_sets_bucket}.{key}", cb=on_write)
            while True:
                changed.clear()
                response = await settled_now(rt, change_set, request.id)
                remaining = deadline - time.monotonic()
                if response.settled or remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(_RECHECK, remaining)):
                        await changed.wait()
        except asyncio.CancelledError:
            await self._answer(reply, _error(change_set, request, STOPPING), content_type)
            raise
        except Exception as err:
            log.warning("settled query on %s failed: %r", change_set, err)
            response = _error(change_set, request, f"{type(err).__name__}: {err}")
        finally:
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        await self._answer(reply, response, content_type)

    async def _answer(
        self, reply: str, response: WaitSettledResponse | None, content_type: ContentType
    ) -> None:
        if response is None:
            return
        headers, body = WAIT_SETTLED_RESPONSE.encode(response, content_type)
        try:
            await self._rt.nc.publish(reply, body, headers=headers)
        except Exception as err:
            log.warning("answering a settled query failed: %r", err)


def _error(change_set: ChangeSet, request: WaitSettledRequest, error: str) -> WaitSettledResponse:
    return WaitSettledResponse(
        id=request.id,
        workspace_id=change_set.workspace_id,
        change_set_id=change_set.change_set_id,
        error=error,
    )
