"""The cluster's copy of the shard layout: one KV entry, created once, changed only by ``rebaser streams set``; and,
beside it, the durability a daemon last found (:data:`DURABILITY_KEY`).

Daemons create it at start-up from their flags if it does not exist yet (the first one wins; ``create`` is
atomic); everyone else reads it, and a flag that disagrees is a :class:`~rebaser_core.errors.LayoutMismatch`.
:class:`LayoutFollower` keeps a process's copy current by reading the entry every ``poll`` seconds: a direct get,
cheap, and unlike a KV watch (an ordered consumer) it needs nothing re-created after a server restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from rebaser_core.errors import LayoutMismatch, LayoutUnreadable
from rebaser_core.layout import LANES, AssignmentMode, Intake, Layout
from rebaser_core.nats import cancellation
from rebaser_core.nats.durability import Durability
from rebaser_core.nats.streams import open_bucket
from rebaser_core.subjects import Subjects

__all__ = [
    "DURABILITY_KEY",
    "LayoutFollower",
    "init_layout",
    "open_layout",
    "read_durability",
    "read_layout",
    "write_durability",
    "write_layout",
]

log = logging.getLogger(__name__)

# How often a client or daemon looks at the layout entry. A layout change waits at least a few of these before it
# settles (see rebaser_client.admin.streams), so nobody routes by a layout that long gone.
DEFAULT_POLL = 1.0


async def open_layout(
    js: JetStreamContext,
    subjects: Subjects,
    *,
    create: bool = False,
    replicas: int = 1,
    storage: str = "file",
) -> KeyValue | None:
    """The layout bucket; None if it does not exist and ``create`` is false."""
    config = KeyValueConfig(
        bucket=subjects.layout_bucket,
        history=5,
        direct=True,  # clients read it with one direct get (rebaser_client._routing)
        storage=StorageType.FILE if storage == "file" else StorageType.MEMORY,
        replicas=replicas,
    )
    return await open_bucket(js, config, create=create)


async def read_layout(kv: KeyValue, subjects: Subjects) -> tuple[Layout, int] | None:
    """The layout and its revision; None if none was written yet."""
    try:
        entry = await kv.get(subjects.layout_key)
    except KeyNotFoundError:
        return None
    if entry.value is None or entry.revision is None:
        return None
    return Layout.decode(entry.value), entry.revision


async def write_layout(kv: KeyValue, subjects: Subjects, layout: Layout, *, revision: int) -> int:
    """Replace the layout read at ``revision`` (compare-and-set); LayoutMismatch if someone changed it since."""
    try:
        return await kv.update(subjects.layout_key, layout.encode(), last=revision)
    except KeyWrongLastSequenceError:
        raise LayoutMismatch(
            "the layout was changed by someone else meanwhile; look again and retry"
        ) from None


async def init_layout(
    js: JetStreamContext,
    subjects: Subjects,
    *,
    streams: int | None,
    mode: AssignmentMode | None,
    who: str,
    replicas: int = 1,
    storage: str = "file",
    intake: Intake | None = None,
    lanes: int = LANES,
) -> Layout:
    """The cluster's layout, created from the flags (defaults: 1 stream, shared, the lanes intake) if there is none
    yet; flags that disagree with an existing layout raise LayoutMismatch."""
    kv = await open_layout(js, subjects, create=True, replicas=replicas, storage=storage)
    assert kv is not None
    for _ in range(3):
        found = await read_layout(kv, subjects)
        if found is not None:
            layout = found[0]
            layout.check_flags(streams, mode, who, intake)
            return layout
        layout = Layout(
            streams=streams or 1, mode=mode or "shared", intake=intake or "lanes", lane_count=lanes
        )
        try:
            await kv.create(subjects.layout_key, layout.encode())
            log.info(
                "created the shard layout: %d streams, %s, %s intake",
                layout.streams,
                layout.mode,
                layout.intake,
            )
            return layout
        except KeyWrongLastSequenceError:
            continue  # another daemon created it first: read theirs
    raise LayoutMismatch("could not create or read the shard layout")


class LayoutFollower:
    """Keeps ``current`` equal to the cluster's layout; calls ``on_change`` (if any) after each change."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        initial: Layout,
        *,
        poll: float = DEFAULT_POLL,
        on_change: Callable[[Layout, Layout], Awaitable[None]] | None = None,
        on_unreadable: Callable[[str | None], None] | None = None,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self.current = initial
        self._poll = poll
        self._on_change = on_change
        # Told when the entry turns unreadable (what was found) and readable again (None): the last layout is kept
        # meanwhile, since routing by a guessed one could give a change set two owners.
        self._on_unreadable = on_unreadable
        self._unreadable = False
        self._kv: KeyValue | None = None
        self._task: asyncio.Task[None] | None = None
        # The loop's own stop flag: a cancellation landing as a NATS answer arrives is swallowed by asyncio.wait_for
        # on Python 3.11 (nats-py's request), and a follower left running would re-assign a stopped daemon's shards.
        self._stopped = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="rebaser layout follower")

    async def stop(self) -> None:
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=self._poll + 1.0)

    async def refresh(self) -> Layout:
        """Read the entry now (bounded by the connection's JetStream timeout); keep the last layout on failure."""
        if self._kv is None:
            self._kv = await open_layout(self._js, self._subjects)
        if self._kv is not None:
            try:
                found = await read_layout(self._kv, self._subjects)
            except LayoutUnreadable as err:
                if not self._unreadable:
                    log.error("%s; still routing by the last layout read", err)
                    self._unreadable = True
                    if self._on_unreadable is not None:
                        self._on_unreadable(str(err))
                raise
            if self._unreadable:
                self._unreadable = False
                log.warning("the cluster's layout entry reads again")
                if self._on_unreadable is not None:
                    self._on_unreadable(None)
            if found is not None and found[0] != self.current:
                old, self.current = self.current, found[0]
                log.warning(
                    "shard layout changed: %d -> %d streams%s",
                    old.streams,
                    self.current.streams,
                    f" (draining {self.current.previous})" if self.current.migrating else "",
                )
                if self._on_change is not None and not self._stopped:
                    await self._on_change(old, self.current)
        return self.current

    async def _run(self) -> None:
        while not self._stopped:
            await cancellation.sleep(self._poll)
            if self._stopped:
                return
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # NATS trouble: keep routing by the last layout, look again next time
                log.debug("reading the shard layout failed: %s", err)


DURABILITY_KEY = "durability"
"""The layout bucket's other key: the durability a daemon last found (its monitoring reads), for ``rebaser status``
run without the servers' monitoring URLs."""


async def write_durability(kv: KeyValue, durability: Durability, by: str) -> None:
    """Note ``durability`` as daemon ``by`` found it now."""
    at = datetime.now(UTC).isoformat(timespec="seconds")
    await kv.put(DURABILITY_KEY, json.dumps({"by": by, "at": at, **durability.as_dict()}).encode())


async def read_durability(kv: KeyValue) -> tuple[Durability, str, str] | None:
    """The durability a daemon last noted, which daemon and when (ISO time); None if none did (or unreadable)."""
    try:
        entry = await kv.get(DURABILITY_KEY)
        data = json.loads(entry.value or b"")
        return Durability.from_dict(data), str(data.get("by", "")), str(data.get("at", ""))
    except (KeyNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        return None
