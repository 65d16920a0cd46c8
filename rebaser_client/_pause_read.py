"""Reading the pauses bucket (``rebaser_core.pauses``): one change set's pauses, or all of them.

Below both :mod:`rebaser_client._pausing` (which writes them) and the operators' reports in
``rebaser_client.admin`` (``status`` and ``change-set show`` show pauses). NATS errors are left to the caller, which
turns them into its one line.

A key whose value is not a pause counts as one, as the daemons count it (fail closed): ``Pause.unreadable``, cause
``unreadable``, which ``status`` lists with the command that deletes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from rebaser_core.errors import DecodeError
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.bucket_watch import stop_watch, watch_bucket
from rebaser_core.nats.pause_store import open_pauses
from rebaser_core.pauses import Pause, change_set_key, parse_key, workspace_key
from rebaser_core.subjects import Subjects

__all__ = ["MAX_LISTED_PAUSES", "PausedLine", "all_pauses", "pauses_of", "read_pause"]

# `status` reads every pause to count them and sum their queues; past this many it stops reading (and says so).
MAX_LISTED_PAUSES = 10_000


@dataclass(frozen=True)
class PausedLine:
    """A paused change set (``change_set_id`` set) or workspace (None), and what is queued behind it."""

    workspace_id: str
    change_set_id: str | None
    pause: Pause
    queued: int = 0  # requests in the streams (of every change set of the workspace, for a workspace)


async def read_pause(kv: KeyValue, key: str) -> Pause | None:
    try:
        entry = await kv.get(key)  # a deleted key raises KeyDeletedError, a KeyNotFoundError
    except KeyNotFoundError:
        return None
    try:
        return Pause.decode(entry.value or b"")
    except DecodeError as err:
        return Pause.unreadable(err)


async def pauses_of(
    js: JetStreamContext, subjects: Subjects, workspace_id: WorkspacePk, change_set_id: ChangeSetId
) -> tuple[Pause | None, Pause | None]:
    """(the change set's own pause, its workspace's pause); each None if there is none."""
    kv = await open_pauses(js, subjects, create=False)
    if kv is None:
        return None, None
    own = await read_pause(kv, change_set_key(workspace_id, change_set_id))
    return own, await read_pause(kv, workspace_key(workspace_id))


async def all_pauses(
    js: JetStreamContext, subjects: Subjects, *, bound: int = MAX_LISTED_PAUSES, timeout: float = 5.0
) -> tuple[list[PausedLine], bool]:
    """(every pause, oldest first; True if there were more than ``bound`` and the rest was not read)."""
    kv = await open_pauses(js, subjects, create=False)
    if kv is None:
        return [], False
    found: list[PausedLine] = []
    truncated = False
    watcher = await watch_bucket(kv, ignore_deletes=True)
    try:
        while (entry := await watcher.updates(timeout=timeout)) is not None:
            target = parse_key(entry.key)
            if target is None:
                continue
            try:
                pause = Pause.decode(entry.value or b"")
            except DecodeError as err:
                created = getattr(entry, "created", None)
                pause = Pause.unreadable(err, created.timestamp() if isinstance(created, datetime) else None)
            if len(found) >= bound:
                truncated = True
                break
            wk, cs = target
            found.append(PausedLine(str(wk), None if cs is None else str(cs), pause))
    finally:
        await stop_watch(js, subjects.pauses_bucket, watcher)
    found.sort(key=lambda line: (line.pause.since, line.workspace_id, line.change_set_id or ""))
    return found, truncated
