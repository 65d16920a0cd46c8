"""``lease_mode`` daemon: this daemon's heartbeat (rebaser_server.task.heartbeat), and the :class:`Reaper`, which hands
a silent peer's tasks back, so a dead daemon's change sets stall ``ack_wait``, not the tasks consumer's long
``task_ack_wait``.

Every daemon watches the daemons bucket. A peer whose key has kept the revision this daemon received for
``ack_wait`` (measured from when it was received, which is after it was stored), and still has it when read again
then, has sent no confirmed heartbeat since: its heartbeat has lapsed (heartbeat.py), so it acts on none of its tasks
any more. This daemon then hands them back: for each change set with a task in some shard's tasks stream whose
record names the dead peer as owner with that very task message, it deletes the message (the peer's late ack of it
can then take nothing from anyone) and publishes a fresh task, which any daemon takes as usual. Then it deletes the
peer's key, if it still has that revision. Peers racing to do the same do no harm: a deleted message is not found
twice, and the tasks stream keeps at most one task per change set.

Cost: one watch of a small bucket per daemon; on a death, one stream info per shard and one record read per change
set with a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from rebaser_core.errors import InvalidSubject
from rebaser_core.nats import cancellation
from rebaser_core.nats.bucket_watch import BucketWatch, stop_watch, watch_bucket
from rebaser_core.nats.listing import stream_subjects
from rebaser_core.nats.streams import open_bucket
from rebaser_core.nats.tasks import publish_task
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.context import Nats, Placement, Stats
from rebaser_server.record.store import ChangeSetStore, StillSilent
from rebaser_server.task.heartbeat import Heartbeat

__all__ = ["Liveness", "Reaper"]

log = logging.getLogger(__name__)


class Reaper:
    def __init__(
        self,
        nats: Nats,
        settings: Settings,
        placement: Placement,
        store: ChangeSetStore,
        kv: KeyValue,
        own_key: str,
        stats: Stats,
    ) -> None:
        self._nats = nats
        self._store = store
        self._settings = settings
        self._placement = placement
        self._kv = kv
        self._own_key = own_key
        self._seen: dict[str, tuple[int, float, str]] = {}  # key -> (revision, received at, owner)
        self._stats = stats

    async def run(self) -> None:
        """Follow the daemons bucket; every ``progress_period``, hand back the tasks of peers silent too long."""
        watcher = await watch_bucket(self._kv)
        follow = asyncio.create_task(self._follow(watcher), name="rebaser reaper watch")
        try:
            while True:
                await cancellation.sleep(self._settings.progress_period)
                await self._reap_silent()
        finally:
            follow.cancel()
            await asyncio.wait({follow})
            await stop_watch(self._nats.js, self._settings.subjects.daemons_bucket, watcher)

    async def _follow(self, watcher: BucketWatch) -> None:
        async for entry in watcher:
            if entry is None or entry.key == self._own_key:
                continue  # the end of the initial values, or this daemon's own
            if entry.operation in (KV_DEL, KV_PURGE):
                self._seen.pop(entry.key, None)
                continue
            try:
                owner = str(json.loads(entry.value or b"{}")["owner"])
            except (ValueError, KeyError, TypeError):
                continue  # not a heartbeat: written by someone else, ignored
            self._seen[entry.key] = (entry.revision or 0, time.monotonic(), owner)

    async def _reap_silent(self) -> None:
        now = time.monotonic()
        for key, (revision, received, owner) in list(self._seen.items()):
            if now - received < self._settings.ack_wait:
                continue
            try:
                latest = (await self._kv.get(key)).revision
            except KeyNotFoundError:
                self._seen.pop(key, None)  # stopped cleanly, or another peer reaped it
                continue
            except Exception as err:
                log.debug("reading the heartbeat of %s failed: %r", owner, err)
                continue
            if latest != revision:
                # It beat after all. Counted from now (after the new revision was stored), in case the watch missed
                # it (a watch can lag, or be lost with its server): the next look needs no watch to be right.
                self._seen[key] = (latest or 0, time.monotonic(), owner)
                continue
            log.warning("daemon %s silent for %.1f s: handing its change sets back", owner, now - received)
            try:
                unread = await self.hand_back_tasks_of(
                    owner, still_silent=functools.partial(self._silent, key, revision)
                )
            except Exception as err:
                log.warning("handing back the change sets of %s failed (%r); trying again", owner, err)
                continue
            if unread:
                # Its key stays, so the next look (this daemon's or a peer's) tries those change sets again.
                log.warning(
                    "%d change sets of %s could not be read: trying again at the next look", unread, owner
                )
                continue
            self._stats.silent_peers += 1
            self._seen.pop(key, None)
            with contextlib.suppress(Exception):
                await self._kv.delete(key, last=revision)

    async def hand_back_tasks_of(self, owner: str, *, still_silent: StillSilent | None = None) -> int:
        """Hand back every task ``owner`` holds in any shard (each counted in ``peer_tasks_handed_back``); how many
        change sets with a task could not be told apart (their record could not be read). ``still_silent`` is
        asked for each change set between the read of its record and its mark (ChangeSetStore.mark_reaped)."""
        unread = 0
        for shard in self._placement.layout.shards:
            unread += await self._hand_back_in(
                self._settings.subjects.for_shard(shard), shard, owner, still_silent
            )
        return unread

    async def _silent(self, key: str, revision: int) -> bool:
        """Whether the heartbeat ``key`` is still at ``revision``. A daemon whose heartbeat comes back (a new
        generation) takes tasks again under the same name: a change set it took since is its own, not the silent
        one's, and handing it back let a peer apply beside it (seen in the NATS-outage battery)."""
        try:
            return (await self._kv.get(key)).revision == revision
        except KeyNotFoundError:
            return True  # deleted by a peer that handed back first: still gone

    async def _hand_back_in(
        self, subjects: Subjects, shard: int, owner: str, still_silent: StillSilent | None
    ) -> int:
        js = self._nats.js
        tasks = await stream_subjects(js, subjects.tasks_stream, subjects.tasks_all)
        count = unread = 0
        for subject in tasks:
            try:
                parsed = subjects.parse_task(subject)
            except InvalidSubject:
                continue  # the orphan sweep removes junk
            change_set = ChangeSet(parsed.workspace_id, parsed.change_set_id)
            try:
                # Marked (compare-and-set) before its task goes: the next owner counts a takeover.
                record = await self._store.mark_reaped(change_set, owner, still_silent=still_silent)
            except Exception as err:
                log.info("%s: reading its record failed (%r); it is looked at again", change_set, err)
                unread += 1
                continue
            if record is None or record.shard != shard:
                continue
            try:
                await js.delete_msg(subjects.tasks_stream, record.task_seq)
            except NotFoundError:
                continue  # acked meanwhile, or another peer was quicker
            # Published where tasks are published (the subject listed is the stored one: with the lanes intake
            # ``….<lane>``, where no stream listens).
            await publish_task(self._nats.nc, subjects.task(parsed.workspace_id, parsed.change_set_id))
            self._stats.peer_tasks_handed_back += 1
            count += 1
            log.info("%s: handed back (its owner %s is silent)", change_set, owner)
        if count:
            log.warning("handed back %d change sets of %s in shard %d", count, owner, shard)
        return unread


class Liveness:
    """The daemon's side of ``lease_mode`` daemon: the daemons bucket, the heartbeat and the reaper, started before
    the first task is taken and stopped after the last is handed back."""

    def __init__(
        self,
        nats: Nats,
        settings: Settings,
        placement: Placement,
        store: ChangeSetStore,
        owner: str,
        stats: Stats,
    ) -> None:
        self._nats, self._settings, self._placement, self._store = nats, settings, placement, store
        self._stats = stats
        self.heartbeat = Heartbeat(
            owner, ack_wait=settings.ack_wait, margin=settings.lease_margin, period=settings.progress_period
        )
        self.reaper: Reaper | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the heartbeat bucket, beat, and start the reaper. Raises on NATS trouble (a cluster still forming);
        calling it again then is safe (the daemon retries it like the rest of its set-up)."""
        if self.reaper is not None:
            return
        settings = self._settings
        config = KeyValueConfig(
            bucket=settings.subjects.daemons_bucket,
            history=1,
            storage=StorageType.FILE if settings.storage == "file" else StorageType.MEMORY,
            replicas=settings.replicas,
        )
        kv = await open_bucket(self._nats.js, config, create=True)
        assert kv is not None
        await self.heartbeat.start(kv, timeout=settings.nats_timeout)
        self.reaper = Reaper(
            self._nats, settings, self._placement, self._store, kv, self.heartbeat.key, self._stats
        )
        self._task = asyncio.create_task(self.reaper.run(), name="rebaser reaper")

    async def stop(self, *, handed_back: bool) -> None:
        """Stop beating and reaping. ``handed_back``: every owned change set was handed back, confirmed; the key goes,
        telling peers nothing of this daemon's is left. Else it stays and lapses, and peers hand back what this
        daemon may still hold after ``ack_wait`` (deleted, it would wait for ``task_ack_wait``)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
        await self.heartbeat.stop(delete=handed_back)
