"""What operations code reads of a daemon: a small Protocol, so that ``ops`` never imports the daemon.

The daemon (:class:`rebaser_server.daemon.Daemon`) satisfies it; a test can hand the health endpoint or the
metrics collector anything else that does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rebaser_core.layout import Layout
from rebaser_core.nats.durability import Durability
from rebaser_core.pauses import Pause
from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet
from rebaser_server.ops.health import StatusReporter
from rebaser_server.ops.observe import Observer

__all__ = ["Counters", "DaemonView", "PausesView"]


class Counters(Protocol):
    """A daemon's counters (``Stats``), read as a mapping of field to value."""

    def as_dict(self) -> Mapping[str, float | int | None]: ...


class PausesView(Protocol):
    """Paused change sets and workspaces as a daemon sees them (rebaser_server.daemon.pauses)."""

    @property
    def counts(self) -> tuple[int, int]:
        """(paused change sets, paused workspaces)."""

    @property
    def pauses(self) -> Mapping[str, int]:
        """Pauses seen appear since start-up, by cause."""

    @property
    def unreadable(self) -> int:
        """Keys of the pauses bucket that hold no readable pause (each counts as paused)."""

    def listed(self) -> list[tuple[str, Pause, str | None]]:
        """(what, its pause, the command that repairs it if the pause stands for damage)."""


class DaemonView(Protocol):
    @property
    def owner(self) -> str: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def served_shards(self) -> Sequence[int]: ...

    @property
    def stats(self) -> Counters: ...

    @property
    def owned(self) -> Sequence[ChangeSet]: ...

    @property
    def starting(self) -> int:
        """Owned change sets still in their cold path."""

    @property
    def stopping(self) -> bool: ...

    @property
    def serving(self) -> bool:
        """Set-up is done: the daemon answers queries and takes tasks."""

    @property
    def settled_waits(self) -> int:
        """Settled queries held now."""

    @property
    def health(self) -> StatusReporter: ...

    @property
    def durability(self) -> Durability | None:
        """What an acknowledged request survives, as last checked (None: not yet)."""

    @property
    def observe(self) -> Observer: ...

    @property
    def pauses(self) -> PausesView: ...

    @property
    def owned_by_workspace(self) -> Mapping[str, int]:
        """Change sets owned now per workspace."""

    def tasks_by_workspace(self) -> Mapping[str, int]:
        """Tasks in the streams per workspace (waiting, or owned by any daemon), as last read; asking starts a
        new read if that is old."""

    @property
    def tasks_seen_by_workspace(self) -> Mapping[str, int]:
        """The same, as last read."""

    @property
    def workspace_share(self) -> int:
        """At most this many change sets of one workspace are owned at once (max_owned_per_workspace)."""

    @property
    def served_by_workspace(self) -> Mapping[str, int]:
        """Tasks taken per workspace lately (halved every minute)."""

    def intake_status(self) -> Mapping[str, Any]:
        """How tasks reach the daemon: the intake, and the workspaces waiting for a turn."""

    def alive(self) -> str | None:
        """None if the daemon's loops run as they should; else what is wrong (for ``/healthz``)."""
