"""The batch sweep: what JetStream cannot bound per workspace in ``REBASER_STORED_BATCHES``.

The stream bounds every batch's age (``stored_batches_max_age``) and all of them together
(``stored_batches_max_msgs``, discard new). nats-server has no limit per subject prefix, so one workspace's share is
kept here: every ``stored_batches_sweep_interval`` (with jitter) a daemon lists the stream's subjects (one stream info)
and

* deletes the parts of a batch whose manifest has not come ``stored_batch_unfinished_age`` after this daemon first
  saw them (a client that died mid-write, or a flood of parts that will never be named);
* deletes a workspace's oldest batches, whole, while it holds more than ``stored_batches_max_msgs_per_workspace``
  messages: a flood evicts only the flooding workspace's batches (a request naming one is then refused, as for a
  batch never stored);
* removes messages on subjects no daemon would ever read (a workspace token that is not a canonical ULID, an address
  that is not 64 lowercase hex digits), one at a time by sequence (``junk.py``: such a token may act as a wildcard).

A batch is *not* deleted once a request naming it is applied: batches are content-addressed, so two requests (two
clients storing the same updates, or one client enqueueing one batch to several change sets) may name the same batch,
and deleting it after the first would refuse the second. Its age bounds it instead.

Every daemon sweeps; what two of them delete at once is deleted once. The work per sweep is one stream info plus,
for a workspace over its share only, one read per batch of that workspace.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rebaser_core.batches import MANIFEST, is_address
from rebaser_core.errors import InvalidId
from rebaser_core.ids import WorkspacePk
from rebaser_core.nats.listing import stream_subjects
from rebaser_core.settings import Settings
from rebaser_server.changeset.context import Stats
from rebaser_server.daemon.junk import JunkRemover

__all__ = ["BatchSweeper"]

log = logging.getLogger(__name__)

# A stored batch has at most MAX_BATCH_BYTES / PART_BYTES = 64 parts; a part token past this is junk.
_MAX_PART = 1 << 16


@dataclass
class _Batch:
    parts: set[str] = field(default_factory=set)
    manifest: bool = False

    @property
    def messages(self) -> int:
        return len(self.parts) + self.manifest


class BatchSweeper:
    def __init__(self, js: JetStreamContext, settings: Settings, stats: Stats, junk: JunkRemover) -> None:
        self._js = js
        self._settings = settings
        self._subjects = settings.subjects
        self._stats = stats
        self._junk = junk
        # How many subject tokens come before <wk> in [P.]rebaser.batches.<wk>.<address>.<part>.
        self._head = self._subjects.batch_part(WorkspacePk.new(), "x", "x").count(".") - 2
        self._unfinished_since: dict[
            tuple[str, str], float
        ] = {}  # (workspace, address) -> first seen (monotonic)
        self._last = 0.0
        self.sweeps = 0

    def due(self) -> bool:
        """Whether ``stored_batches_sweep_interval`` has passed since the last sweep."""
        return time.monotonic() - self._last >= self._settings.stored_batches_sweep_interval

    async def sweep_once(self) -> int:
        """One sweep; how many batches it deleted (junk messages not counted)."""
        self._last = time.monotonic()
        stream = self._subjects.stored_batches_stream
        try:
            listed = await stream_subjects(self._js, stream, self._subjects.stored_batches_subject)
        except NotFoundError:
            return 0  # not created yet (an older deployment's daemons)
        workspaces, junk = self._group(listed)
        if junk:
            await self._junk.remove(stream, junk, dead_letter=False)
        deleted = await self._unfinished(workspaces)
        cap = self._settings.stored_batches_max_msgs_per_workspace
        if cap >= 0:
            for workspace, batches in workspaces.items():
                if sum(batch.messages for batch in batches.values()) > cap:
                    deleted += await self._over_share(workspace, batches, cap)
        self.sweeps += 1
        self._stats.stored_batches_deleted += deleted
        return deleted

    def _group(self, names: dict[str, int]) -> tuple[dict[str, dict[str, _Batch]], dict[str, str]]:
        """The stream's subjects by workspace and batch, and the junk ones with why."""
        head = self._head
        workspaces: dict[str, dict[str, _Batch]] = {}
        junk: dict[str, str] = {}
        for name in names:
            tokens = name.split(".")
            if len(tokens) != head + 3:
                junk[name] = "not a stored batch's subject"
                continue
            workspace, address, part = tokens[head:]
            try:
                if str(WorkspacePk.parse(workspace)) != workspace:
                    raise InvalidId(workspace)
            except (InvalidId, ValueError):
                junk[name] = "the workspace is not a canonical ULID"
                continue
            if not is_address(address):
                junk[name] = "the address is not 64 lowercase hex digits"
                continue
            if part != MANIFEST and not (part.isdigit() and str(int(part)) == part and int(part) < _MAX_PART):
                junk[name] = "the part is neither a number nor the manifest"
                continue
            batch = workspaces.setdefault(workspace, {}).setdefault(address, _Batch())
            if part == MANIFEST:
                batch.manifest = True
            else:
                batch.parts.add(part)
        return workspaces, junk

    async def _unfinished(self, workspaces: dict[str, dict[str, _Batch]]) -> int:
        """Delete the batches seen without a manifest for ``stored_batch_unfinished_age``; how many."""
        now = time.monotonic()
        seen: dict[tuple[str, str], float] = {}
        deleted = 0
        for workspace, batches in workspaces.items():
            for address, batch in list(batches.items()):
                if batch.manifest:
                    continue
                key = (workspace, address)
                since = self._unfinished_since.get(key, now)
                if now - since < self._settings.stored_batch_unfinished_age:
                    seen[key] = since
                    continue
                if await self._delete(workspace, address):
                    deleted += 1
                    del batches[address]
        self._unfinished_since = seen  # forget what got its manifest, or went
        if deleted:
            log.warning("batch sweep: deleted %d unfinished stored batches (no manifest)", deleted)
        return deleted

    async def _over_share(self, workspace: str, batches: dict[str, _Batch], cap: int) -> int:
        """Delete the workspace's oldest batches until it holds at most ``cap`` messages; how many."""
        stream = self._subjects.stored_batches_stream
        wk = WorkspacePk.parse(workspace)
        aged: list[tuple[int, str]] = []
        for address, batch in batches.items():
            # A batch's age is its manifest's (written last), else its lowest part's.
            last = MANIFEST if batch.manifest else min(batch.parts, key=int)
            try:
                msg = await self._js.get_last_msg(
                    stream, self._subjects.batch_part(wk, address, last), direct=True
                )
            except NotFoundError:
                continue  # deleted meanwhile
            aged.append((int(msg.seq or 0), address))
        total = sum(batch.messages for batch in batches.values())
        deleted = 0
        for _, address in sorted(aged):
            if total <= cap:
                break
            if await self._delete(workspace, address):
                deleted += 1
            total -= batches[address].messages
        log.warning(
            "batch sweep: workspace %s held more than %d stored-batch messages "
            "(stored_batches_max_msgs_per_workspace); deleted its %d oldest batches",
            workspace,
            cap,
            deleted,
        )
        return deleted

    async def _delete(self, workspace: str, address: str) -> bool:
        """Purge one batch, every part and its manifest (the tokens are checked: the filter matches only it)."""
        wk = WorkspacePk.parse(workspace)
        try:
            await self._js.purge_stream(
                self._subjects.stored_batches_stream, subject=self._subjects.batch_part(wk, address, "*")
            )
        except Exception as err:
            log.warning("batch sweep: deleting stored batch %s of %s failed: %s", address, workspace, err)
            return False
        with contextlib.suppress(KeyError):
            del self._unfinished_since[(workspace, address)]
        return True
