"""What the console knows of every change set, kept up to date from what :mod:`~rebaser_client.admin.console.live`
reads: one :class:`Row` per change set, and the filters of the change-set list. Pure: no NATS, no I/O.

A row's **states** (a change set may be in several at once; the list filters on any of them):

- ``running``: a daemon holds its task (delivered to one), and it is not paused;
- ``queued``: requests wait in its stream, and no daemon holds it;
- ``paused``: it, or its workspace, is paused;
- ``retrying``: its record counts retryable failures of a request (the request stays first in line);
- ``dead-lettered``: it has dead letters.

Every change set with a record, a request, a task, a dead letter or a pause has a row, idle ones too: an operator
finds any change set by its id, not only the busy ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from rebaser_client._pause_read import PausedLine
from rebaser_client._record import RecordView
from rebaser_core.pauses import Pause

__all__ = ["STATES", "Filter", "Index", "Row"]

STATES = ("running", "queued", "paused", "retrying", "dead-lettered")


@dataclass
class Row:
    workspace_id: str
    change_set_id: str
    owner: str = ""  # the daemon that took it last (its record), or the one an event says holds it
    epoch: int = 0
    queued: int = (
        0  # requests in its stream (processed ones not yet purged included, as `rebaser status` counts)
    )
    task: str = "none"  # owned (delivered to a daemon) | waiting (for one) | none
    dead_letters: int = 0
    pause: Pause | None = None  # its own pause
    attempts: int = 0  # retryable failures so far of the requests its record names
    oldest_at: float | None = None  # when its first request not yet processed was stored (Unix seconds)
    applied_seq: int = 0  # its record's watermark: the oldest queued request is after it
    shard: int = 0  # the shard of its task (or of its requests)
    dvu_pending: bool = False
    dvu_running: bool = False  # from the event feed: a DVU started and not finished
    last_event: int = 0  # the last durable event's seq (its record, or the feed)
    has_record: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return self.workspace_id, self.change_set_id

    def states(self, workspace_pause: Pause | None = None) -> tuple[str, ...]:
        paused = self.pause is not None or workspace_pause is not None
        found: list[str] = []
        if self.task == "owned" and not paused:
            found.append("running")
        if self.queued and self.task != "owned":
            found.append("queued")
        if paused:
            found.append("paused")
        if self.attempts:
            found.append("retrying")
        if self.dead_letters:
            found.append("dead-lettered")
        return tuple(found)


@dataclass(frozen=True)
class Filter:
    """The change-set list's filter: a workspace, a state (one of :data:`STATES`), both or neither."""

    workspace_id: str | None = None
    state: str | None = None

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> Filter:
        """From a page's query string (``?workspace=...&state=...``); unknown values are ignored, not refused: a
        filter that matches nothing shows an empty list that says so."""
        workspace = (query.get("workspace") or "").strip() or None
        state = (query.get("state") or "").strip() or None
        return cls(workspace, state if state in STATES else None)

    @staticmethod
    def unknown_state(query: Mapping[str, str]) -> str | None:
        """The ``state`` a query string asks for if it is not one of :data:`STATES` (the page refuses it, rather
        than listing every change set under a filter it does not apply)."""
        state = (query.get("state") or "").strip()
        return state if state and state not in STATES else None

    def query(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.workspace_id:
            out["workspace"] = self.workspace_id
        if self.state:
            out["state"] = self.state
        return out

    def describe(self) -> str:
        parts = []
        if self.state:
            parts.append(f"state {self.state}")
        if self.workspace_id:
            parts.append(f"workspace {self.workspace_id}")
        return ", ".join(parts) or "every change set"


@dataclass
class Index:
    """Every row, the workspaces' pauses, and the rows changed since :meth:`take_changed`."""

    rows: dict[tuple[str, str], Row] = field(default_factory=dict)
    workspace_pauses: dict[str, Pause] = field(default_factory=dict)
    _changed: set[tuple[str, str]] = field(default_factory=set)

    def row(self, workspace_id: str, change_set_id: str) -> Row:
        key = (workspace_id, change_set_id)
        found = self.rows.get(key)
        if found is None:
            found = self.rows[key] = Row(workspace_id, change_set_id)
        return found

    def touch(self, key: tuple[str, str]) -> None:
        self._changed.add(key)

    def take_changed(self) -> list[Row]:
        """The rows changed since the last call (each once)."""
        changed, self._changed = self._changed, set()
        return [self.rows[k] for k in sorted(changed) if k in self.rows]

    def workspace_pause(self, row: Row) -> Pause | None:
        return self.workspace_pauses.get(row.workspace_id)

    def states(self, row: Row) -> tuple[str, ...]:
        return row.states(self.workspace_pause(row))

    # -- what the watches and reads say -----------------------------------------------------------------------------
    def apply_record(self, workspace_id: str, change_set_id: str, record: RecordView | None) -> None:
        row = self.row(workspace_id, change_set_id)
        if record is None:
            row.has_record = False
        else:
            if record.applied_seq != row.applied_seq:
                row.oldest_at = None  # its first request moved on: read again (live.py)
            row.has_record = True
            row.owner, row.epoch = record.owner, record.epoch
            row.applied_seq, row.dvu_pending = record.applied_seq, record.dvu_pending
            row.attempts = sum(record.attempts.values())
            row.last_event = max(row.last_event, record.events)
        self.touch(row.key)

    def apply_pause(self, workspace_id: str, change_set_id: str | None, pause: Pause | None) -> None:
        if change_set_id is None:
            if pause is None:
                self.workspace_pauses.pop(workspace_id, None)
            else:
                self.workspace_pauses[workspace_id] = pause
            for key in self.rows:
                if key[0] == workspace_id:
                    self.touch(key)
            return
        row = self.row(workspace_id, change_set_id)
        row.pause = pause
        self.touch(row.key)

    def apply_counts(self, lines: Mapping[tuple[str, str], Mapping[str, int]]) -> None:
        """The streams' subject counts (``rebaser_client.admin.status.read_counts``): queued, task and dead letters
        of every change set that has any; the others have none any more."""
        for key, counts in lines.items():
            row = self.row(*key)
            queued, dead = counts.get("queued", 0), counts.get("dead", 0)
            task = row.task if counts.get("task") else "none"
            if task == "none" and counts.get("task"):
                task = "waiting"  # live.py says which it is once it has read the task
            if (row.queued, row.dead_letters, row.task) != (queued, dead, task):
                if not queued:
                    row.oldest_at = None
                row.queued, row.dead_letters, row.task = queued, dead, task
                self.touch(key)
            if counts.get("task"):
                row.shard = counts.get("shard", row.shard)
        for key, row in self.rows.items():
            if key not in lines and (row.queued or row.dead_letters or row.task != "none"):
                row.queued, row.dead_letters, row.task, row.oldest_at = 0, 0, "none", None
                self.touch(key)

    def set_task(self, row: Row, task: str) -> None:
        if row.task != task:
            row.task = task
            self.touch(row.key)

    def set_oldest(self, row: Row, at: float | None) -> None:
        if row.oldest_at != at:
            row.oldest_at = at
            self.touch(row.key)

    def apply_event(self, workspace_id: str, change_set_id: str, kind: str, owner: str, epoch: int) -> None:
        """What an event says of who holds the change set and whether a DVU runs (the rest comes with its record)."""
        row = self.row(workspace_id, change_set_id)
        if kind == "taken":
            row.owner, row.epoch, row.dvu_running = owner, max(row.epoch, epoch), False
        elif kind == "released":
            row.dvu_running = False
        elif kind == "dvu_started":
            row.dvu_running = True
        elif kind in ("dvu_finished", "dvu_failed"):
            row.dvu_running = False
        else:
            return
        self.touch(row.key)

    # -- what the pages show ----------------------------------------------------------------------------------------
    def matching(self, flt: Filter) -> Iterator[Row]:
        """The rows ``flt`` matches, busiest first (most queued, then most dead letters, then by ids)."""
        rows: Iterable[Row] = self.rows.values()
        if flt.workspace_id:
            rows = (r for r in rows if r.workspace_id == flt.workspace_id)
        if flt.state:
            rows = (r for r in rows if flt.state in self.states(r))
        yield from sorted(rows, key=lambda r: (-r.queued, -r.dead_letters, r.workspace_id, r.change_set_id))

    def matches(self, flt: Filter, row: Row) -> bool:
        if flt.workspace_id and row.workspace_id != flt.workspace_id:
            return False
        return not flt.state or flt.state in self.states(row)

    def find(self, text: str) -> list[Row]:
        """The rows whose change set (or workspace) id is ``text``, or starts with it (at least 6 characters)."""
        text = text.strip().upper()
        if len(text) < 6:
            return []
        return [
            r
            for r in self.rows.values()
            if r.change_set_id.startswith(text) or r.workspace_id.startswith(text)
        ]

    def pauses(self) -> list[PausedLine]:
        """Every pause, oldest first, as ``rebaser status`` lists them."""
        found = [PausedLine(r.workspace_id, r.change_set_id, r.pause) for r in self.rows.values() if r.pause]
        found += [PausedLine(wk, None, pause) for wk, pause in self.workspace_pauses.items()]
        found.sort(key=lambda line: (line.pause.since, line.workspace_id, line.change_set_id or ""))
        return found

    def state_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STATES, 0)
        for row in self.rows.values():
            for state in self.states(row):
                counts[state] += 1
        return counts
