"""The daemon's view of paused change sets and workspaces (rebaser_core.pauses), kept by watching the bucket.

Every daemon watches ``REBASER_PAUSES`` from start-up on (it takes no task before the bucket's contents are loaded),
so a pause reaches every daemon within milliseconds of being stored. What it does with it:

- a task of a paused change set is acked at once, without touching the change set (:meth:`PauseWatcher.holding`,
  which asks the bucket itself before giving up a task: the watch may lag behind a resume);
- an owned change set that becomes paused is told (``on_pause``): its owner lets it go at the next request boundary;
- the orphan sweep gives no task to a paused change set.

It also stores the pauses the daemon decides itself (``on_max_attempts = "pause"``, and the quarantine of a change
set whose record is unreadable) and counts them, by cause.

A key whose value is not a pause counts as paused (fail closed, ``Pause.unreadable``): garbage written over a pause,
by a bug or by someone with write access to the bucket, must not lift it, least of all silently at the next
restart. It is logged, shown on ``/status`` with the command that deletes it, and counted on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from datetime import datetime

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from rebaser_core.errors import DecodeError
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.bucket_watch import BucketWatch, stop_watch, watch_bucket
from rebaser_core.nats.pause_store import open_pauses
from rebaser_core.pauses import Pause, change_set_key, parse_key, repair_command, workspace_key
from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet

__all__ = ["PauseWatcher"]

log = logging.getLogger(__name__)

# (workspace, change set) of a pause; change set None: the whole workspace.
Paused = tuple[WorkspacePk, ChangeSetId | None]


class PauseWatcher:
    """``on_pause(workspace, change_set or None, pause)``: a pause appeared (the daemon lets go of what it covers)."""

    def __init__(
        self,
        js: JetStreamContext,
        settings: Settings,
        on_pause: Callable[[WorkspacePk, ChangeSetId | None, Pause], None],
    ) -> None:
        self._js = js
        self._settings = settings
        self._on_pause = on_pause
        self._paused: dict[Paused, Pause] = {}
        self._kv: KeyValue | None = None
        self._watcher: BucketWatch | None = None
        self._task: asyncio.Task[None] | None = None
        self.pauses = Counter[str]()  # pauses seen appear, by cause (rebaser_core.pauses.PAUSE_CAUSES)

    async def start(self) -> None:
        """Open (or create) the bucket and load what it holds; then follow it in the background."""
        settings = self._settings
        self._kv = await open_pauses(
            self._js, settings.subjects, create=True, replicas=settings.replicas, storage=settings.storage
        )
        assert self._kv is not None
        self._watcher = watcher = await watch_bucket(self._kv)
        while (entry := await watcher.updates(timeout=settings.nats_timeout)) is not None:
            self._apply(entry, initial=True)
        self._task = asyncio.create_task(self._follow(watcher), name="pauses")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await stop_watch(self._js, self._settings.subjects.pauses_bucket, watcher)

    async def _follow(self, watcher: BucketWatch) -> None:
        async for entry in watcher:
            if entry is not None:
                self._apply(entry, initial=False)

    def _apply(self, entry: KeyValue.Entry, *, initial: bool) -> None:
        target = parse_key(entry.key)
        if target is None:
            return  # not a pause key: written by someone else, ignored
        if entry.operation in (KV_DEL, KV_PURGE):
            if self._paused.pop(target, None) is not None:
                log.info("resumed: %s", _name(target))
            return
        try:
            pause = Pause.decode(entry.value or b"")
        except DecodeError as err:
            pause = Pause.unreadable(err, _created(entry))
            if not _is_unreadable(self._paused.get(target)):  # once per entry gone bad, not at every rewrite
                log.error(
                    "the pause %s cannot be read (%s): %s counts as paused until it is repaired: %s",
                    entry.key,
                    err,
                    _name(target),
                    repair_command(pause, *target),
                )
        new = target not in self._paused
        self._paused[target] = pause
        if new and not initial:
            self.pauses[pause.cause] += 1
            log.info("paused: %s (%s: %s)", _name(target), pause.cause, pause.reason)
        self._on_pause(*target, pause)

    # -- reading -----------------------------------------------------------------------------------------------
    def paused(self, change_set: ChangeSet) -> Pause | None:
        """What holds ``change_set``, as last seen: its own pause, else its workspace's."""
        if not self._paused:
            return None
        return self._paused.get((change_set.workspace_id, change_set.change_set_id)) or self._paused.get(
            (change_set.workspace_id, None)
        )

    async def holding(self, change_set: ChangeSet) -> Pause | None:
        """What holds ``change_set`` now, asked of the bucket itself when the view says it is paused (a resume may
        not have reached the watch yet; a task given up wrongly would wait for the orphan sweep)."""
        if self.paused(change_set) is None or self._kv is None:
            return None
        wk, cs = change_set.workspace_id, change_set.change_set_id
        for key in (change_set_key(wk, cs), workspace_key(wk)):
            try:
                entry = await self._kv.get(key)
            except KeyNotFoundError:
                continue
            try:
                return Pause.decode(entry.value or b"")
            except DecodeError as err:
                return Pause.unreadable(err, _created(entry))  # fail closed, as the watch does
        return None

    @property
    def counts(self) -> tuple[int, int]:
        """(paused change sets, paused workspaces), as last seen."""
        workspaces = sum(1 for _, cs in self._paused if cs is None)
        return len(self._paused) - workspaces, workspaces

    def targets(self) -> list[Paused]:
        """(workspace, change set or None) of every pause, as last seen."""
        return list(self._paused)

    @property
    def unreadable(self) -> int:
        """Keys of the bucket that hold no readable pause (each counts as paused), as last seen."""
        return sum(1 for pause in self._paused.values() if pause.cause == "unreadable")

    def listed(self) -> list[tuple[str, Pause, str | None]]:
        """(what, its pause, the command that repairs it if the pause stands for damage) of every pause."""
        return [
            (_name(target), pause, repair_command(pause, *target)) for target, pause in self._paused.items()
        ]

    # -- writing -----------------------------------------------------------------------------------------------
    async def pause(self, change_set: ChangeSet, pause: Pause) -> None:
        """Store a pause this daemon decided (a request that failed max_attempts times)."""
        assert self._kv is not None
        target = (change_set.workspace_id, change_set.change_set_id)
        await self._kv.put(change_set_key(*target), pause.encode())
        if target not in self._paused:  # the watch will see it too; counted once
            self._paused[target] = pause
            self.pauses[pause.cause] += 1


def _is_unreadable(pause: Pause | None) -> bool:
    return pause is not None and pause.cause == "unreadable"


def _created(entry: KeyValue.Entry) -> float | None:
    """When ``entry`` was written (nats-py reads it from the message's metadata), if known."""
    created = getattr(entry, "created", None)
    return created.timestamp() if isinstance(created, datetime) else None


def _name(target: Paused) -> str:
    wk, cs = target
    return f"workspace {wk}" if cs is None else f"change set {wk}/{cs}"
