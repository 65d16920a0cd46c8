"""The ``settled`` query: hold the reply until a change set has nothing queued and no DVU due.

Any daemon of the query group answers, owner or not: whether a change set is settled is read from JetStream, not
from memory. Settled means: the last request stored for it is at or below its record's watermark (``applied_seq``;
processed requests still waiting for their purge count as done) and no DVU is due, or one is due but nothing owns
the change set (no task), so nothing would run it before the next request (a DVU that kept failing at release).

The wait does not poll in a loop: it *watches* the change set's record, with an ordered consumer on the record's KV
subject that delivers the record as stored now and then every later write (each processed request group and each DVU
commits one), and looks again on each delivery, coalesced; plus after ``_RECHECK`` seconds, then less and less
often, for what changes without a record write (an operator's purge, a task acked). The record is taken from the
delivery itself, not read back: a consumer delivers a write only once it is stored, whereas a core NATS subscription
to the KV subject sees a write *before* it is stored (a read right after may still return the previous record,
and the wait would then hang until the next re-check) and sees compare-and-set writes the stream refused too. Each
wait is a task of its own (a query callback must not hold the subscription), bounded in number (``MAX_WAITS``): each
holds one consumer.

One workspace holds at most ``settled_max_waits_per_workspace`` of a daemon's waits, so it cannot take the
``MAX_WAITS`` every workspace shares. A wait over either cap is not held but looked at once: a change set already
settled is answered settled, any other with an ``error`` ending in ``ask again`` (the client asks again a little
later, and may reach another daemon). Those one-off looks are bounded too (``MAX_LOOKS``); past them the answer is
``ask again`` without a look, and past ``MAX_BUSY_ANSWERS`` of those on their way there is no answer (the caller's
own timeout ends it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from rebaser_core import headers as h
from rebaser_core.api import (
    MAX_SETTLED_WAIT,
    WAIT_SETTLED_RESPONSE,
    ContentType,
    WaitSettledRequest,
    WaitSettledResponse,
)
from rebaser_core.ids import RequestId, WorkspacePk
from rebaser_core.layout import Layout
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.context import Placement
from rebaser_server.record.model import ChangeSetRecord

__all__ = ["SettledWaits", "settled_now"]

log = logging.getLogger(__name__)

# Look again at least this often even without a record write (what can change without one is rare: a purge, a task
# acked): after 1 s, then less and less often, so a thousand held waits cost little while nothing happens.
_RECHECK = 1.0
_RECHECK_MAX = 8.0
# Waits one daemon holds at once (one consumer each); beyond it a wait is answered with an error at once (the caller
# asks again, and may reach another daemon).
MAX_WAITS = 1_000
# One-off looks (three reads) at waits over a cap, in flight at once; beyond it they are answered "ask again" unlooked.
MAX_LOOKS = 1_000
# Past MAX_LOOKS a wait gets "ask again" at once; at most this many such answers on their way, then none.
MAX_BUSY_ANSWERS = 1_000
# A wait's consumer is deleted by the server this long after the wait ends (or its daemon dies).
_WATCH_INACTIVE = 5.0
_KV_OPERATION = "KV-Operation"  # DEL or PURGE on a deleted record
STOPPING = "the daemon answering stopped; ask again"


class Unread:
    """No record seen yet: ``settled_now`` reads it, after looking at the streams."""


UNREAD = Unread()


async def settled_now(
    js: JetStreamContext,
    subjects: Subjects,
    layout: Layout,
    change_set: ChangeSet,
    query_id: RequestId,
    record: ChangeSetRecord | Unread | None = UNREAD,
) -> WaitSettledResponse:
    """The change set's settled facts as of now, given its record as last seen (read again before saying settled),
    or none seen yet (read once, after the streams). ``subjects``: shard 0's names and the shared ones; ``layout``:
    the cluster's shard layout as this daemon last read it."""
    wk, cs = change_set.workspace_id, change_set.change_set_id
    # The change set's shard, and while the layout changes its old shard too (docs/operations.md). The record's
    # watermark counts in the stream of the shard it names; in another shard nothing stored is processed yet.
    shards = [subjects.for_shard(layout.shard_of(wk, cs))]
    old = layout.old_shard_of(wk, cs)
    if old is not None:
        shards.append(subjects.for_shard(old))
    last: dict[int, int] = {}  # shard -> the last request stored for the change set there
    owned = False
    for names in shards:
        # Both from the stream leader, not a direct get a lagging replica may answer: a request the caller stored
        # just before asking, or a task just taken, must be seen.
        try:
            msg = await js.get_last_msg(names.requests_stream, names.requests(wk, cs))
            last[names.shard] = int(msg.seq or 0)
        except NotFoundError:
            pass
        try:
            await js.get_last_msg(names.tasks_stream, names.stored_task(wk, cs))
            owned = True
        except NotFoundError:
            pass
    if not isinstance(record, Unread):
        response = _judge(change_set, query_id, record, last, owned)
        if not response.settled:
            return response
    # A record given was read (or delivered) before the streams were looked at: in between, its owner may have
    # processed a request, deleted it and let a DVU become due (a request gone from the stream is not queued, but
    # the stale record knows of no DVU), or finished the DVU and let the change set go (the task acked after the
    # DVU's commit). Only a record read after the look at the streams tells; read it again rather than call settled
    # what is not. A request stored after that look is one the caller did not wait for.
    fresh = await _record(js, subjects.change_sets_bucket, Subjects.change_set_key(wk, cs))
    return _judge(change_set, query_id, fresh, last, owned)


def _judge(
    change_set: ChangeSet,
    query_id: RequestId,
    record: ChangeSetRecord | None,
    last: dict[int, int],
    owned: bool,
) -> WaitSettledResponse:
    """Settled or not, from the last request stored per shard, whether a task exists, and the record."""
    applied = record.applied_seq if record else 0
    queued = any(
        seq > (applied if record is not None and record.shard == shard else 0) for shard, seq in last.items()
    )
    dvu = bool(record and record.dvu_pending)
    return WaitSettledResponse(
        id=query_id,
        workspace_id=change_set.workspace_id,
        change_set_id=change_set.change_set_id,
        settled=not queued and (not dvu or not owned),
        queued=queued,
        dvu_pending=dvu,
        owned=owned,
        applied_seq=applied,
    )


class SettledWaits:
    """The settled queries this daemon holds."""

    def __init__(
        self, nc: NatsClient, js: JetStreamContext, settings: Settings, placement: Placement
    ) -> None:
        self._nc, self._js = nc, js
        self._settings = settings
        self._subjects = settings.subjects  # made once: Settings.subjects builds (and validates) new ones
        self._placement = placement  # the shard layout, as the daemon follows it
        self._waits: set[asyncio.Task[None]] = set()
        self._looks: set[asyncio.Task[None]] = set()  # one-off looks at waits over a cap (not held)
        self._busy_answers: set[asyncio.Task[None]] = (
            set()
        )  # "ask again" answers past MAX_LOOKS, on their way
        self.dropped = 0  # waits past every bound, not answered (their callers' timeouts answer them)
        self._per_workspace: dict[WorkspacePk, int] = {}  # held waits by workspace

    @property
    def held(self) -> int:
        """Waits held now."""
        return len(self._waits)

    def start(
        self, reply: str, change_set: ChangeSet, request: WaitSettledRequest, content_type: ContentType
    ) -> None:
        """Answer ``request`` on ``reply`` once the change set is settled or the wait is over (in the background).
        Over a cap (``MAX_WAITS``, ``settled_max_waits_per_workspace``) the change set is looked at once instead:
        answered settled if it is, else asked to ask again."""
        workspace = change_set.workspace_id
        cap = self._settings.settled_max_waits_per_workspace
        if len(self._waits) >= MAX_WAITS or self._per_workspace.get(workspace, 0) >= cap:
            full = (
                f"this daemon already holds {MAX_WAITS} settled waits"
                if len(self._waits) >= MAX_WAITS
                else f"this daemon already holds {cap} settled waits of workspace {workspace} "
                "(settled_max_waits_per_workspace)"
            )
            busy = _error(change_set, request, f"{full}; ask again")
            if len(self._looks) < MAX_LOOKS:
                look = asyncio.create_task(self._look(reply, change_set, request, content_type, busy))
                self._looks.add(look)
                look.add_done_callback(self._looks.discard)
            elif len(self._busy_answers) < MAX_BUSY_ANSWERS:
                answer = asyncio.create_task(self._answer(reply, busy, content_type))
                self._busy_answers.add(answer)
                answer.add_done_callback(self._busy_answers.discard)
            else:
                # Past every bound: not answered. The caller's own timeout answers it, and the client asks again.
                self.dropped += 1
            return
        task = asyncio.create_task(
            self._wait(reply, change_set, request, content_type), name=f"settled {change_set}"
        )
        self._waits.add(task)
        self._per_workspace[workspace] = self._per_workspace.get(workspace, 0) + 1

        def done(task: asyncio.Task[None]) -> None:
            self._waits.discard(task)
            left = self._per_workspace.pop(workspace, 1) - 1
            if left > 0:
                self._per_workspace[workspace] = left

        task.add_done_callback(done)

    async def _look(
        self,
        reply: str,
        change_set: ChangeSet,
        request: WaitSettledRequest,
        content_type: ContentType,
        busy: WaitSettledResponse,
    ) -> None:
        """A wait over a cap: settled now is answered so, anything else ``busy`` (ask again), without holding."""
        try:
            response = await settled_now(
                self._js, self._subjects, self._placement.layout, change_set, request.id
            )
        except asyncio.CancelledError:
            await self._answer(reply, _error(change_set, request, STOPPING), content_type)
            raise
        except Exception as err:
            log.warning("settled query on %s failed: %r", change_set, err)
            response = _error(change_set, request, f"{type(err).__name__}: {err}")
        await self._answer(reply, response if response.settled or response.error else busy, content_type)

    async def stop(self) -> None:
        """Answer every held wait with an error saying to ask again (another daemon will answer it)."""
        waits = [*self._waits, *self._looks, *self._busy_answers]
        for task in waits:
            task.cancel()
        if waits:
            await asyncio.wait(waits, timeout=self._settings.nats_timeout)

    async def _wait(
        self, reply: str, change_set: ChangeSet, request: WaitSettledRequest, content_type: ContentType
    ) -> None:
        js, subjects, placement = self._js, self._subjects, self._placement
        changed = asyncio.Event()
        # The record as last delivered by the watch (None: deleted); the watch delivers the current one first.
        latest: list[ChangeSetRecord | None] = []

        async def on_write(msg: Msg) -> None:
            deleted = h.get_header(msg.headers, _KV_OPERATION) in ("DEL", "PURGE")
            try:
                latest[:] = [None if deleted or not msg.data else ChangeSetRecord.decode(msg.data)]
            except Exception as err:  # not ours to judge here: look again on the next write or re-check
                log.warning("settled wait on %s: unreadable record: %r", change_set, err)
            changed.set()

        key = Subjects.change_set_key(change_set.workspace_id, change_set.change_set_id)
        bucket = subjects.change_sets_bucket
        sub: Any = None
        deadline = time.monotonic() + min(request.timeout, MAX_SETTLED_WAIT)
        response: WaitSettledResponse | None = None
        try:
            # Most waits find the change set settled already: answer those without setting up a watch.
            response = await settled_now(js, subjects, placement.layout, change_set, request.id)
            if response.settled or request.timeout <= 0:
                await self._answer(reply, response, content_type)
                return
            sub = await js.subscribe(
                f"$KV.{bucket}.{key}",
                stream=f"KV_{bucket}",
                cb=on_write,
                ordered_consumer=True,
                deliver_policy=js_api.DeliverPolicy.LAST_PER_SUBJECT,
                inactive_threshold=_WATCH_INACTIVE,
            )
            recheck = _RECHECK
            while True:
                changed.clear()
                # Until the watch has delivered (the record may not exist), settled_now reads it; a write after the
                # read is delivered by the watch anyway.
                response = await settled_now(
                    js, subjects, placement.layout, change_set, request.id, latest[0] if latest else UNREAD
                )
                remaining = deadline - time.monotonic()
                if response.settled or remaining <= 0:
                    break
                try:
                    async with asyncio.timeout(min(recheck, remaining)):
                        await changed.wait()
                except TimeoutError:
                    recheck = min(recheck * 2, _RECHECK_MAX)
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
            await self._nc.publish(reply, body, headers=headers)
        except Exception as err:
            log.warning("answering a settled query failed: %r", err)


async def _record(js: JetStreamContext, bucket: str, key: str) -> ChangeSetRecord | None:
    """The change set's record, read from the KV stream's leader (a replica may not have the last write yet)."""
    try:
        msg = await js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}")
    except NotFoundError:
        return None
    if not msg.data or h.get_header(msg.headers, _KV_OPERATION) in ("DEL", "PURGE"):
        return None
    return ChangeSetRecord.decode(msg.data)


def _error(change_set: ChangeSet, request: WaitSettledRequest, error: str) -> WaitSettledResponse:
    return WaitSettledResponse(
        id=request.id,
        workspace_id=change_set.workspace_id,
        change_set_id=change_set.change_set_id,
        error=error,
    )
