"""Changing a deployment's intake online (``rebaser streams intake fifo|fair|lanes``): how tasks reach the daemons.

A work-queue stream cannot hold the fifo intake's shared consumer beside the fair intake's consumers per workspace
(their filters overlap), and a task handed out by one consumer is unknown to the other: a new consumer would hand a
held task out again at once. So the change runs in five steps, each safe to interrupt and to run again:

1. **Let go**: write the layout with the new intake and the old one as ``intake_from`` (compare-and-set). Every
   daemon stops taking tasks, and hands back what it owns (it finishes the request in hand and nacks the task), while
   the old consumers still exist.
2. **Wait**: a few seconds, for every daemon to read the layout (each does within ``DEFAULT_POLL``) and let go.
3. **Remove**: delete the old consumers, then wait their ``ack_wait``: a daemon that still held a task (stalled, cut
   off) cannot renew its lease on a deleted consumer, so by then it has stopped acting on it.
4. **Move**: to or from the lanes intake, the tasks streams store tasks under another subject (the lanes' subject
   transform, set or removed): each task stored in the old form is published again in the new one (refused as a
   duplicate if the change set has one already) and then deleted. Nobody holds a task now, so none changes hands.
5. **Settle**: write the layout without ``intake_from``; the daemons take tasks again, through the new intake (to
   fifo or lanes, they make the shared or the lanes' consumers). Nothing queued is lost.

Requests are stored throughout; no change set is applied between steps 1 and 4 (a few seconds: the hand-back and
``ack_wait``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from rebaser_client.admin.streams import current_layout
from rebaser_core.errors import LayoutMismatch
from rebaser_core.layout import Intake, Layout
from rebaser_core.nats.layout_store import DEFAULT_POLL, open_layout, write_layout
from rebaser_core.nats.tasks import store_tasks_as
from rebaser_core.subjects import LANE_CONSUMER, TASKS_CONSUMER, Subjects

__all__ = ["change_intake"]

_JS_TIMEOUT = 5.0
# How long step 2 gives the daemons to read the layout and hand back what they own.
_LET_GO = 3 * DEFAULT_POLL
# Waited beyond the old consumers' ack_wait, for a renewal in flight when they were deleted.
_LEASE_MARGIN = 1.0


async def change_intake(
    nc: NatsClient,
    subjects: Subjects,
    intake: Intake,
    *,
    progress: Callable[[str], None] = lambda _line: None,
) -> Layout:
    """Change the deployment's intake to ``intake`` (see the module doc); the settled layout."""
    js = nc.jetstream(timeout=_JS_TIMEOUT)
    layout, revision = await current_layout(js, subjects)
    kv = await open_layout(js, subjects)
    assert kv is not None  # current_layout read it
    if layout.migrating:
        raise LayoutMismatch(
            f"the change to {layout.streams} streams is still draining; finish it first "
            f"('rebaser streams set {layout.streams}' resumes waiting)"
        )
    if layout.intake == intake and not layout.switching_intake:
        progress(f"the intake is already {intake}; nothing to do")
        return layout
    if not layout.switching_intake:
        layout = layout.changed_intake(intake)
        revision = await write_layout(kv, subjects, layout, revision=revision)
        progress(f"intake: {layout.intake_from} -> {intake}; the daemons hand back what they own")
    elif layout.intake != intake:
        raise LayoutMismatch(
            f"the change of intake to {layout.intake} is under way; finish it first "
            f"('rebaser streams intake {layout.intake}' resumes it)"
        )
    # Every daemon reads the layout within DEFAULT_POLL and then lets go. A task nacked back still counts as pending
    # on its consumer until it is delivered again (nats-server keeps it in the consumer's pending list), so the
    # consumers cannot tell when all have: wait for the daemons to read it, then let the deletion end the rest.
    await asyncio.sleep(_LET_GO)
    old = await _old_consumers(js, subjects, layout)
    ack_wait = max((info.config.ack_wait or 0.0 for _, info in old), default=0.0)
    for stream, info in old:
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(stream, info.name)
    if old:
        progress(
            f"deleted {len(old)} consumers of the {layout.intake_from} intake; waiting {ack_wait:g}s of leases"
        )
        await asyncio.sleep(ack_wait + _LEASE_MARGIN)  # the protocol's own wait: see step 3
    moved = await _move_tasks(nc, js, subjects, layout)
    if moved:
        progress(f"moved {moved} tasks to the {intake} intake's subjects")
    # (To fifo or lanes, the daemons make the consumers with their own settings as they read the settled layout.)
    layout = layout.intake_settled()
    await write_layout(kv, subjects, layout, revision=revision)
    progress(f"intake: {intake}")
    return layout


async def _old_consumers(
    js: JetStreamContext, subjects: Subjects, layout: Layout
) -> list[tuple[str, js_api.ConsumerInfo]]:
    """The consumers of the intake being left, with the stream each is on: the shared one per shard (fifo), every
    workspace's (fair), or every lane's (lanes)."""
    found: list[tuple[str, js_api.ConsumerInfo]] = []
    for shard in layout.shards:
        stream = subjects.for_shard(shard).tasks_stream
        for info in await _all_consumers(js, stream):
            name = info.name or ""
            shared = name == TASKS_CONSUMER
            if (
                (layout.intake_from == "fifo" and shared)
                or (layout.intake_from == "fair" and name.startswith(f"{TASKS_CONSUMER}-"))
                or (layout.intake_from == "lanes" and name.startswith(f"{LANE_CONSUMER}-"))
            ):
                found.append((stream, info))
    return found


async def _all_consumers(js: JetStreamContext, stream: str) -> list[js_api.ConsumerInfo]:
    """Every consumer of ``stream`` (nats-server lists them 256 at a time)."""
    found: list[js_api.ConsumerInfo] = []
    while True:
        page = await js.consumers_info(stream, offset=len(found))
        found += page
        if len(page) < 256:
            return found


async def _move_tasks(nc: NatsClient, js: JetStreamContext, subjects: Subjects, layout: Layout) -> int:
    """Step 4: every shard's tasks stream stores tasks the new intake's way (by lane, or not), and the tasks stored
    the old way are stored again the new way; how many moved."""
    moved = 0
    for shard in layout.shards:
        moved += await store_tasks_as(nc, js, subjects.for_shard(shard), layout.lanes)
    return moved
