"""Per-change-set order across a change of the number of shards.

When ``rebaser streams set N`` changes the layout, most change sets move to another shard: clients publish their
new requests there, while requests published before the change still sit in the old shard. The rule that keeps
each change set's order: **the old shard drains first**. A task taken from a change set's *new* shard is handed
back (with a short delay) while its old shard still holds a request or a task of that change set; a task taken
from the *old* shard is processed as usual and lets go as soon as it is idle (``ChangeSetProcessor`` asks
:func:`draining`), so the new shard's task goes on within about a second of the old shard running dry.

A client publishes a request only after the previous one of the same caller was stored (it awaits the PubAck), so a
request it sent under the old layout is in the old shard before any it sends under the new one: the check below
sees it. What this cannot order is a client that still routes by the old layout (it reads the layout every second)
publishing concurrently with one that already uses the new: those requests were concurrent anyway. See
docs/operations.md.
"""

from __future__ import annotations

from nats.js.errors import NotFoundError

from rebaser_core.layout import Layout
from rebaser_core.nats.layout_store import open_layout, read_layout
from rebaser_core.nats.tasks import publish_task
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.context import Nats

__all__ = ["draining", "old_shard_busy"]


def draining(layout: Layout, change_set: ChangeSet, subjects: Subjects) -> bool:
    """Is ``subjects`` (the shard a task came from) no longer the change set's shard by ``layout``? Then its owner
    only drains."""
    return layout.shard_of(change_set.workspace_id, change_set.change_set_id) != subjects.shard


async def old_shard_busy(
    nats: Nats, settings: Settings, layout: Layout, change_set: ChangeSet, subjects: Subjects
) -> str | None:
    """Why a task of the change set's new shard must wait for its old shard; None when it may go on. ``layout``:
    this daemon's copy of the cluster's shard layout."""
    wk, cs = change_set.workspace_id, change_set.change_set_id
    if draining(layout, change_set, subjects):
        # By this daemon's copy of the layout the task is an old shard's. But the copy is up to a poll behind:
        # under a change it has not seen yet (6 -> 2), a task from the change set's *new* shard (an existing
        # shard) looks just like that, and treating it as the drain would apply the new requests before the old.
        # Ask the cluster before letting it go first (rare: only tasks outside their change set's shard).
        layout = await _current_layout(nats, settings.subjects, layout)
        if layout.shard_of(wk, cs) != subjects.shard:
            return None  # this task is the old shard's: it is the one that drains
    old = layout.old_shard_of(wk, cs)
    if old is None:
        return None
    names = settings.subjects.for_shard(old)
    if await nats.queued(change_set, subjects=names, timeout=settings.nats_timeout):
        # Make sure the old requests have a task (refused as a duplicate if they have one: harmless), so the wait
        # is for the old shard's owner, never for the orphan sweep.
        await publish_task(
            nats.nc,
            names.task(change_set.workspace_id, change_set.change_set_id),
            timeout=settings.nats_timeout,
        )
        return f"requests still queued in its old shard {old}"
    try:
        await nats.js.get_last_msg(
            names.tasks_stream,
            names.stored_task(change_set.workspace_id, change_set.change_set_id),
            direct=False,
        )
    except NotFoundError:
        return None
    return f"its old shard {old} still has a task (its owner is finishing)"


async def _current_layout(nats: Nats, subjects: Subjects, known: Layout) -> Layout:
    """The cluster's layout now (``known`` if none is stored; NATS errors propagate: the task is then retried,
    never taken on a guess)."""
    kv = await open_layout(nats.js, subjects)
    found = None if kv is None else await read_layout(kv, subjects)
    return known if found is None else found[0]
