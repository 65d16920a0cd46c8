"""What a daemon shows of itself: the properties operations code reads (:class:`rebaser_server.ops.view.DaemonView`:
``/status``, ``/metrics``, the health endpoint), and the parts tests and embedding code reach for.

:class:`DaemonReadouts` is the base of :class:`~rebaser_server.daemon.daemon.Daemon`, which makes the parts these
read (its ``__init__`` says what each is).
"""

from __future__ import annotations

from typing import Any

from rebaser_core.layout import Layout
from rebaser_core.nats.durability import Durability
from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.context import Nats, Report, Stats
from rebaser_server.changeset.owning import Owning
from rebaser_server.daemon.owned import OwnedChangeSets
from rebaser_server.daemon.shards import ShardPullers
from rebaser_server.intake.admission import Admission
from rebaser_server.intake.fair_intakes import FairIntakes
from rebaser_server.ops.durability import DurabilityCheck
from rebaser_server.ops.observe import Observer
from rebaser_server.queries.service import QueryService
from rebaser_server.record.store import ChangeSetStore
from rebaser_server.task.keeper import LeaseKeeper

__all__ = ["DaemonReadouts"]


class DaemonReadouts:
    """The daemon's read-only face: what it owns, serves and counts, read from the parts it is wired of."""

    # The daemon's parts these read (Daemon.__init__ makes them).
    _owning: Owning
    _owned: OwnedChangeSets
    _admission: Admission
    _durability: DurabilityCheck
    _stopping: bool
    shards: ShardPullers
    intakes: FairIntakes
    queries: QueryService

    # -- what operations code reads (rebaser_server.ops.view.DaemonView) ---------------------------------
    @property
    def owner(self) -> str:
        return self._owning.owner

    @property
    def settings(self) -> Settings:
        return self._owning.settings

    @property
    def layout(self) -> Layout:
        return self._owning.placement.layout

    @property
    def served_shards(self) -> list[int]:
        return self.shards.shards

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def settled_waits(self) -> int:
        return self.queries.settled.held

    @property
    def observe(self) -> Observer:
        return self._owning.report.observe

    @property
    def stats(self) -> Stats:
        return self._owning.report.stats

    # -- the parts tests and embedding code reach for -------------------------------------------------
    @property
    def nats(self) -> Nats:
        return self._owning.nats

    @property
    def store(self) -> ChangeSetStore:
        return self._owning.store

    @property
    def keeper(self) -> LeaseKeeper:
        return self._owning.keeper

    @property
    def report(self) -> Report:
        return self._owning.report

    @property
    def durability(self) -> Durability | None:
        """What an acknowledged request survives, as last checked (None: not checked yet)."""
        return self._durability.last

    @property
    def owned(self) -> list[ChangeSet]:
        return self._owned.change_sets

    @property
    def owned_by_workspace(self) -> dict[str, int]:
        """Change sets owned now per workspace (each at most ``max_owned_per_workspace``: the share)."""
        return {str(wk): n for wk, n in self._owned.fair.by_workspace.items()}

    def tasks_by_workspace(self) -> dict[str, int]:
        """Tasks in the served shards' streams per workspace (waiting, or owned by any daemon), as last read; asking
        starts a new read in the background if that is over a second old."""
        return {str(wk): n for wk, n in self._owned.fair.tasks_by_workspace().items()}

    @property
    def tasks_seen_by_workspace(self) -> dict[str, int]:
        """The same as last read (for /metrics, which cannot wait for a read)."""
        return {str(wk): n for wk, n in self._owned.fair.tasks.items()}

    @property
    def workspace_share(self) -> int:
        return self._owned.fair.share

    @property
    def served_by_workspace(self) -> dict[str, int]:
        """Tasks taken per workspace lately (halved every minute): the share each is served here."""
        return {str(wk): n for wk, n in self._owned.fair.served_lately().items()}

    def intake_status(self) -> dict[str, Any]:
        """How tasks reach this daemon (``/status``'s ``intake``): see FairIntakes.status."""
        return self.intakes.status()

    @property
    def starting(self) -> int:
        """Owned change sets still in their cold path (record, consumer, first request delivered): see ``_pull``."""
        return self._admission.starting
