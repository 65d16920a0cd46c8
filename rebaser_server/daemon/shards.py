"""Which shards this daemon serves, one task puller per shard, following the cluster's layout.

``shared`` (the default): every daemon pulls every shard's tasks consumer; a task is still delivered to one daemon
only (the consumer is a work queue), so exclusivity needs no assignment. ``pinned`` (the seed runbook's): daemon
``i`` of ``R`` serves shards ``i, i+R, i+2R, ...``; a shard whose daemon is down is served by nobody, its change
sets wait (their tasks stay queued, nothing is lost) and ``/status`` and ``rebaser streams show`` name it, until
that daemon is back (docs/operations.md, "a shard without a daemon").

While the layout changes (``Layout.previous``) the daemon also serves the shards that drain.

An unreadable layout entry (garbage written over it) is never guessed around: set-up waits for its repair
(``rebaser_server.daemon.startup``), and a running daemon keeps serving by the last layout it read. Either way
``problems`` names it with its repair, for ``/readyz`` and ``/status``, until the entry reads again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from rebaser_core.errors import LayoutMismatch, LayoutUnreadable
from rebaser_core.layout import Layout, ordinal_from_hostname, pinned_shards
from rebaser_core.nats.layout_store import LayoutFollower, init_layout
from rebaser_core.nats.streams import ensure_layout_streams
from rebaser_core.nats.tasks import store_tasks_as
from rebaser_core.settings import Settings
from rebaser_core.subjects import LANE_CONSUMER, Subjects
from rebaser_server.changeset.context import Nats, Placement
from rebaser_server.intake.puller import TaskPuller
from rebaser_server.task.handback import hand_back

__all__ = ["ShardPullers", "replica_index", "served_shards"]

log = logging.getLogger(__name__)

PullLoop = Callable[[TaskPuller, Subjects], Coroutine[Any, Any, None]]


def replica_index(settings: Settings, hostname: str | None = None) -> int:
    """Pinned mode: this daemon's index, from ``--replica-index`` or the hostname's StatefulSet ordinal."""
    if settings.replica_index is not None:
        return settings.replica_index
    name = hostname if hostname is not None else socket.gethostname()
    ordinal = ordinal_from_hostname(name)
    if ordinal is None:
        raise LayoutMismatch(
            f"pinned mode needs this daemon's index: pass --replica-index, or run it under a hostname ending in "
            f"-<ordinal> (rebaser-2 is 2); the hostname is {name!r}"
        )
    return ordinal


def served_shards(layout: Layout, settings: Settings, hostname: str | None = None) -> list[int]:
    """The shards this daemon pulls tasks from under ``layout``."""
    if layout.mode == "shared":
        return list(layout.shards)
    if settings.daemons is None:
        raise LayoutMismatch("pinned mode needs --daemons R (how many daemons share the shards)")
    index = replica_index(settings, hostname)
    pinned_shards(index, settings.daemons, layout.streams)  # refuses R > N and an index outside 0..R-1
    # Round robin over every shard that may hold work, so draining shards have a daemon too.
    return [k for k in layout.shards if k % settings.daemons == index]


@dataclass
class _Puller:
    shard: int
    sub: TaskPuller
    task: asyncio.Task[None]


class ShardPullers:
    """One pull loop (the daemon's ``_pull``) per served shard; started, changed and stopped with the layout."""

    def __init__(
        self,
        nats: Nats,
        settings: Settings,
        placement: Placement,
        pull: PullLoop,
        *,
        expires: float,
        hostname: str | None = None,
        on_intake_switch: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self._nats = nats
        self._settings = settings
        self._placement = placement  # its layout is written here, as the cluster's changes
        self._pull = pull
        self._expires = expires  # of each pull request (rebaser_server.intake.puller)
        self._hostname = hostname
        self._on_intake_switch = (
            on_intake_switch  # the intake began to change: let go of every owned change set
        )
        self._pullers: dict[int, _Puller] = {}
        # What an operator must repair, by what ("layout": its entry is unreadable): shown on /readyz and /status.
        self.problems: dict[str, str] = {}
        self._follower: LayoutFollower | None = None
        self._lock = asyncio.Lock()

    @property
    def shards(self) -> list[int]:
        return sorted(self._pullers)

    async def set_up(self) -> Layout:
        """Read (or create) the layout, check this daemon's flags against it, and ensure every shard's streams."""
        js, settings = self._nats.js, self._settings
        try:
            layout = await init_layout(
                js,
                settings.subjects,
                streams=settings.streams,
                mode=settings.assignment,
                who="this daemon",
                replicas=settings.replicas,
                storage=settings.storage,
                intake=settings.intake,
                lanes=settings.lanes,
            )
        except LayoutUnreadable as err:
            self._problem(str(err))  # set-up waits for the repair (startup.py)
            raise
        self._problem(None)
        served_shards(layout, settings, self._hostname)  # refuse a bad pinned set-up before serving anything
        await ensure_layout_streams(js, settings, layout)
        await self._tasks_in_lanes(layout)
        self._placement.layout = layout
        return layout

    async def _tasks_in_lanes(self, layout: Layout) -> None:
        """With the lanes intake, tasks stored before the stream stored them by lane (a stream made by a script or
        an older version before its layout said lanes) are stored again in their lanes: no lane's consumer would
        deliver them. Only while the lanes' consumers are the stream's only ones (no other could hold one)."""
        if not layout.lane_consumers:
            return
        js = self._nats.js
        for shard in layout.shards:
            names = self._settings.subjects.for_shard(shard)
            consumers = await js.consumers_info(names.tasks_stream)
            if any(not (info.name or "").startswith(f"{LANE_CONSUMER}-") for info in consumers):
                log.warning(
                    "shard %d's tasks stream has consumers besides the lanes'; tasks stored before the lanes are "
                    "left where they are (rebaser streams intake lanes moves them safely)",
                    shard,
                )
                continue
            moved = await store_tasks_as(self._nats.nc, js, names, layout.lanes)
            if moved:
                log.warning(
                    "stored %d tasks of shard %d in their lanes (stored before the lanes)", moved, shard
                )

    async def start(self) -> None:
        layout = self._placement.layout
        await self._apply(layout)
        self._follower = LayoutFollower(
            self._nats.js,
            self._settings.subjects,
            layout,
            on_change=self._on_change,
            on_unreadable=self._problem,
        )
        self._follower.start()

    def _problem(self, unreadable: str | None) -> None:
        """The layout entry is unreadable (what was found, naming its repair), or readable again (None)."""
        if unreadable is None:
            self.problems.pop("layout", None)
        else:
            self.problems["layout"] = unreadable

    async def _on_change(self, old: Layout, new: Layout) -> None:
        try:
            await ensure_layout_streams(self._nats.js, self._settings, new)
            await self._tasks_in_lanes(new)
        except Exception as err:
            log.warning("ensuring the streams of the new layout failed (%s); serving what exists", err)
        self._placement.layout = new
        if (old.intake, old.intake_from) != (new.intake, new.intake_from):
            # Another intake, or the start or end of a change of intake: every loop stops, and while the intake
            # changes none runs (rebaser_client.admin.intake waits for what was held to be let go).
            async with self._lock:
                pullers = list(self._pullers.values())
                self._pullers.clear()
                for puller in pullers:
                    await self._stop_one(puller)
            if new.switching_intake and self._on_intake_switch is not None:
                await self._on_intake_switch()
        try:
            await self._apply(new)
        except LayoutMismatch as err:
            # E.g. pinned with more daemons than the new number of streams: keep serving what we served.
            log.error("cannot follow the new layout: %s", err)

    async def _apply(self, layout: Layout) -> None:
        async with self._lock:
            wanted = (
                set()
                if layout.switching_intake
                else set(served_shards(layout, self._settings, self._hostname))
            )
            for shard in sorted(set(self._pullers) - wanted):
                await self._stop_one(self._pullers.pop(shard))
            for shard in sorted(wanted - set(self._pullers)):
                subjects = self._settings.subjects.for_shard(shard)
                sub = TaskPuller(
                    self._nats.nc, subjects.tasks_stream, subjects.tasks_consumer, expires=self._expires
                )
                task = asyncio.create_task(self._pull(sub, subjects), name=f"rebaser task puller {shard}")
                self._pullers[shard] = _Puller(shard, sub, task)
            if layout.switching_intake:
                log.info(
                    "taking no task while the intake changes from %s to %s", layout.intake_from, layout.intake
                )
            else:
                log.info(
                    "serving shards %s of %d (%s, %s intake)",
                    sorted(wanted),
                    layout.streams,
                    layout.mode,
                    layout.intake,
                )

    async def _stop_one(self, puller: _Puller, grace: float = 0.0) -> None:
        if grace > 0:
            await asyncio.wait({puller.task}, timeout=grace)
        if not puller.task.done():
            puller.task.cancel()
            await asyncio.wait({puller.task}, timeout=2.0)
        with contextlib.suppress(Exception):
            await puller.sub.stop()
        for msg in puller.sub.leftovers():  # delivered, never taken: hand back at once
            with contextlib.suppress(Exception):
                await hand_back(self._nats.nc, msg)

    def stopped_unexpectedly(self) -> bool:
        return any(p.task.done() for p in self._pullers.values())

    async def stop(self, grace: float) -> None:
        """Stop following the layout and every puller (each may finish its fetch within ``grace``)."""
        if self._follower is not None:
            await self._follower.stop()
        pullers = list(self._pullers.values())
        self._pullers.clear()
        if pullers and grace > 0:
            await asyncio.wait({p.task for p in pullers}, timeout=grace)
        for puller in pullers:
            await self._stop_one(puller)
