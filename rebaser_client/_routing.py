"""Which shard's streams a client publishes a change set's requests and tasks to.

The client reads the cluster's layout once when it starts and then follows it (one read a second). It reads with a
single direct get on the layout bucket's stream (``$JS.API.DIRECT.GET.<stream>.<subject>``), which needs only that
one subject in a caller's publish permissions (docs/nats-accounts.conf), not the JetStream API.

No layout entry means no daemon has set the deployment up yet (or it predates shards): the client routes by the
``streams`` it was given (default 1) until one appears. A ``streams`` that disagrees with the cluster's layout at
start is a LayoutMismatch, never silent mis-routing.

Until the layout has been read (a client started while disconnected, or whose first read failed), or when the last
read is older than ``MAX_LAYOUT_AGE`` (reads failing, or back from a disconnection), the client does not know where a
change set's requests go: it publishes none (they are spooled, or the caller is told ``RebaserUnavailable``) rather
than guess (shard 0, or an old layout's shard no daemon serves once a change settled), where a request would be
applied out of order with the same caller's later ones in the change set's real shard, or not at all. Before it
says so, an enqueue reads the layout again (up to ``_CONFIRM_READS`` reads, each shared by every enqueue waiting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import nats.errors
from nats.aio.client import Client as NatsClient

from rebaser_core.errors import LayoutMismatch, RebaserUnavailable
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.layout import Layout
from rebaser_core.nats import cancellation
from rebaser_core.nats.layout_store import DEFAULT_POLL
from rebaser_core.subjects import Subjects

__all__ = ["Router", "fetch_layout", "routed"]

log = logging.getLogger(__name__)

_READ_TIMEOUT = 2.0
# Reads an enqueue makes (one after another, shared with every concurrent enqueue) before it calls the layout
# unknown: a read that times out on a connected client means NATS (or this client's event loop) is slow, not gone.
_CONFIRM_READS = 3
# A layout read longer ago than this is not routed by: a client whose reads failed, or that was disconnected, may
# have missed a layout change, and one that settles (``rebaser streams set`` waits 3 polls) makes its old shards
# no longer served. The follower reads every DEFAULT_POLL, so a connected client is never this far behind.
MAX_LAYOUT_AGE = 2.5 * DEFAULT_POLL
_KV_STREAM = "KV_"


async def fetch_layout(nc: NatsClient, subjects: Subjects, timeout: float = _READ_TIMEOUT) -> Layout | None:
    """The cluster's layout by one direct get; None if there is none (no bucket, no entry, or a delete marker)."""
    bucket = subjects.layout_bucket
    api = f"$JS.API.DIRECT.GET.{_KV_STREAM}{bucket}.$KV.{bucket}.{subjects.layout_key}"
    try:
        msg = await nc.request(api, b"", timeout=timeout)
    except nats.errors.NoRespondersError:
        return None
    headers = msg.headers or {}
    status = headers.get("Status")
    if status is not None and status != "404":
        # Not an answer about the entry (a timeout or an error status): the layout was not read.
        raise nats.errors.Error(
            f"the layout read was answered with status {status} {headers.get('Description', '')}"
        )
    if status is not None or headers.get("KV-Operation") in ("DEL", "PURGE") or not msg.data:
        return None  # 404: no entry yet (or a delete marker)
    return Layout.decode(msg.data)


async def routed(
    nc: NatsClient, subjects: Subjects, workspace_id: WorkspacePk, change_set_id: ChangeSetId
) -> Subjects:
    """The names of the shard a change set's requests go to now (one layout read; shard 0 without a layout)."""
    try:
        layout = await fetch_layout(nc, subjects)
    except (TimeoutError, nats.errors.Error) as err:  # one line for an operator, not a traceback
        raise RebaserUnavailable(f"reading the shard layout failed: {err or type(err).__name__}") from None
    return subjects if layout is None else subjects.for_shard(layout.shard_of(workspace_id, change_set_id))


class Router:
    """The client's copy of the layout, and the shard names of each change set under it."""

    def __init__(self, nc: NatsClient, subjects: Subjects, *, streams: int | None = None) -> None:
        self._nc = nc
        self._subjects = subjects
        self._flag = streams
        self._layout = Layout(streams=streams or 1)
        # When the layout was last read from the cluster (an answer saying there is none counts); None: never.
        self._read_at: float | None = None
        self._poller: asyncio.Task[None] | None = None
        # The read in flight, which every caller that needs one awaits: a burst of enqueues on a stale layout makes
        # one read, not one each (a thousand reads on a busy connection would each time out).
        self._reading: asyncio.Future[None] | None = None
        # The poller's own stop flag: asyncio.wait_for (in nats-py's request) can swallow its cancellation on Python
        # 3.11, and close() awaits the poller: without the flag, close would then wait for ever.
        self._closed = False
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Read the layout once (a flag that disagrees raises LayoutMismatch), then follow it. Idempotent."""
        if self._poller is not None:
            return
        async with self._lock:
            if self._poller is not None:
                return
            read_failed = False
            try:
                # Disconnected: do not wait for the read (enqueues fail fast or spool meanwhile); the follower reads it.
                found = await fetch_layout(self._nc, self._subjects) if self._nc.is_connected else None
            except (TimeoutError, nats.errors.Error) as err:
                # NATS is slow: nothing is routed until a read succeeds (the follower keeps looking).
                log.warning("cannot read the shard layout (%s); requests wait until it is read", err)
                found, read_failed = None, True
            if found is not None:
                found.check_flags(self._flag, None, "this client")
                self.layout = found
            elif self._nc.is_connected and not read_failed:
                self._read_at = time.monotonic()  # the cluster has no layout: route by the flag
            self._closed = False
            self._poller = asyncio.create_task(self._follow(), name="rebaser layout follower")

    @property
    def layout(self) -> Layout:
        return self._layout

    @layout.setter
    def layout(self, layout: Layout) -> None:
        self._layout = layout
        self._read_at = time.monotonic()

    @property
    def known(self) -> bool:
        """Was the layout read, recently enough that a layout change it missed has not settled yet?"""
        return self._read_at is not None and time.monotonic() - self._read_at <= MAX_LAYOUT_AGE

    async def confirm(self) -> None:
        """If the layout is not known (never read, or not lately) and NATS is connected, read it now: up to
        ``_CONFIRM_READS`` reads, each shared with every concurrent caller (errors leave it unknown)."""
        for _ in range(_CONFIRM_READS):
            if self.known or not self._nc.is_connected:
                return
            await self._read_shared()

    async def _read_shared(self) -> None:
        """Join the read in flight, or start one. Shielded: a caller that gives up does not cancel the others'."""
        reading = self._reading
        if reading is None or reading.done():
            reading = self._reading = asyncio.ensure_future(self._follow_once())
        await asyncio.shield(reading)

    unknown_reason = (
        "the cluster's shard layout has not been read lately (NATS unreachable?): not routing by a guess"
    )

    def check_known(self) -> None:
        """RebaserUnavailable while the layout was never read: no request may be routed by a guess."""
        if not self.known:
            raise RebaserUnavailable(self.unknown_reason)

    async def close(self) -> None:
        self._closed = True
        poller, self._poller = self._poller, None
        reading, self._reading = self._reading, None
        for task in (poller, reading):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def subjects_for(self, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> Subjects:
        return self._subjects.for_shard(self.layout.shard_of(workspace_id, change_set_id))

    def reroute(self, subject: str, headers: dict[str, str]) -> tuple[str, dict[str, str]]:
        """A request subject stored under an earlier layout (the spool), routed by the current one."""
        self.check_known()
        parsed = self._subjects.parse_any_requests(subject)
        names = self.subjects_for(parsed.workspace_id, parsed.change_set_id)
        new_headers = dict(headers)
        for name in list(new_headers):
            if name.lower() == "nats-expected-stream":
                new_headers[name] = names.requests_stream
        return names.requests(parsed.workspace_id, parsed.change_set_id), new_headers

    async def _follow(self) -> None:
        while not self._closed:
            await cancellation.sleep(DEFAULT_POLL)
            if self._nc.is_connected and not self._closed:
                await self._read_shared()

    async def _follow_once(self) -> None:
        try:
            found = await fetch_layout(self._nc, self._subjects)
        except (TimeoutError, nats.errors.Error, LayoutMismatch) as err:
            log.debug("reading the shard layout failed: %s", err)
            return
        if found is None:
            self._read_at = time.monotonic()  # no layout entry: route by the flag, as at start
            return
        if self._read_at is None:
            try:  # the check start() could not make
                found.check_flags(self._flag, None, "this client")
            except LayoutMismatch as err:
                log.error("%s", err)
                return  # stays unknown: nothing is routed by a disagreeing flag
        if found != self.layout:
            log.info("shard layout changed: %d -> %d streams", self.layout.streams, found.streams)
        self.layout = found
