"""What the owned change sets of one daemon share, cut by concern: each collaborator takes the parts it uses.

- :class:`Nats`: the connection and the two lighter ways the request path talks to JetStream;
- :class:`Report`: where the change-set code says what happened (counters, metrics/logs/traces, test checkpoints);
- :class:`Placement`: where the daemon stands in the cluster (the shard layout, whether it is full);
- :class:`Stats`: the daemon's counters.

The daemon makes one of each; :class:`~rebaser_server.changeset.processor.Owning` hands them to the processor of
each owned change set, which passes on to every piece below it only what that piece uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from rebaser_core.layout import Layout
from rebaser_core.nats.requester import Requester
from rebaser_core.pauses import Pause
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet
from rebaser_server.changeset.hooks import Hooks
from rebaser_server.changeset.quiet import GiveWay
from rebaser_server.ops.observe import Observer
from rebaser_server.record.direct_reads import DirectReads

__all__ = ["Nats", "Pauses", "Placement", "Report", "Stats"]


@dataclass
class Stats:
    """Counters of one daemon (shown on the health endpoint's ``/status``)."""

    tasks_taken: int = 0
    tasks_released: int = 0
    tasks_retried: int = 0
    tasks_interrupted: int = 0
    tasks_fenced: int = 0
    tasks_wedged: int = 0
    tasks_dropped: int = 0  # tasks with nothing to do and no record: terminated without creating one
    requests_applied: int = 0
    # Applied requests by the status of their reply (a permanent app failure is an error reply *and* a dead letter).
    requests_ok: int = 0
    requests_conflict: int = 0
    requests_error: int = 0
    requests_refused: int = 0  # refused by the app (RefusedError): answered, not dead-lettered
    request_commits: int = 0  # record commits for requests: fewer than requests when group commits form
    requests_replayed: int = 0
    requests_dead_lettered: int = 0
    dead_letter_failures: int = 0  # dead-letter copies given up (refused twice, or the stream unreachable)
    # A workspace's oldest dead letters purged to keep it at dead_letter_max_per_workspace (replies.py).
    dead_letters_evicted: int = 0
    # Stored batches deleted by the batch sweep: unfinished, or over their workspace's share (daemon/batch_sweep.py).
    stored_batches_deleted: int = 0
    requests_retried: int = 0
    delete_failures: int = 0
    # Tasks handed over without a handback (the owner died or froze), lease renewals and leases lost.
    unclean_takeovers: int = 0
    lease_renewals: int = 0
    leases_lost: int = 0
    tasks_lease_lost: int = 0
    tasks_stale: int = 0
    release_checks_failed: int = 0
    # New-shard tasks handed back while their change set still had work in its old shard (a layout change).
    tasks_deferred: int = 0
    # Tasks handed back with a delay because their workspace owned max_owned_per_workspace change sets here.
    tasks_deferred_fair_share: int = 0
    # Events published to the change sets' feed and acknowledged, and publications that failed (changeset/events.py).
    events_published: int = 0
    event_publish_failures: int = 0
    tasks_paused: int = 0  # ownerships ended by a pause (or taken while paused: acked, nothing done)
    # Change sets quarantined because their record could not be read (changeset/quarantine.py): once each.
    records_unreadable: int = 0
    dvu_runs: int = 0
    dvu_failures: int = 0
    nats_reconnects: int = 0
    # Owned change sets handed back after a reconnect (their ordered consumers may be gone).
    reconnect_handbacks: int = 0
    # Owned change sets' request consumers replaced after a lost delivery or a silence (consumer.py).
    consumer_resets: int = 0
    # lease_mode daemon: peers found silent, and the tasks of theirs handed back (rebaser_server.daemon.liveness).
    silent_peers: int = 0
    peer_tasks_handed_back: int = 0
    # lease_mode daemon: tasks this daemon handed back itself after its heartbeat lapsed (Lease.hand_back_after_lapse).
    lapse_hand_backs: int = 0
    # Wall clock: the last request answered, and the last write JetStream acknowledged (a purge of processed
    # requests; see trimmer.py).
    last_request_at: float | None = None
    last_publish_at: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return dict(self.__dict__)


class Nats:
    """The daemon's NATS connection, and the lighter paths its per-request work takes.

    ``requester``: request-reply over one subscription for the hot paths (commits, deletes, consumer calls), see
    :mod:`rebaser_core.nats.requester`; ``reads``: a stream's last message as its leader has it
    (:mod:`rebaser_server.record.direct_reads`).
    """

    def __init__(
        self, nc: NatsClient, js: JetStreamContext, requester: Requester, reads: DirectReads
    ) -> None:
        self.nc, self.js, self.requester, self.reads = nc, js, requester, reads

    async def queued(self, change_set: ChangeSet, *, subjects: Subjects, timeout: float) -> bool:
        """Is any request of this change set still in the stream of shard ``subjects``, as the stream leader has
        it? One get, no consumer.

        Asked where a decision must not miss a request just written (after a release, across a layout change): a
        direct get any replica answers could come from one that lags behind the leader. So it is a direct get only
        where the leader alone can answer one (a quarter of the server's work), else ``STREAM.MSG.GET``, over the
        light requester (this runs at every release)."""
        subject = subjects.requests(change_set.workspace_id, change_set.change_set_id)
        last = await self.reads.last_message(subjects.requests_stream, subject, timeout=timeout)
        return last is not None


class Pauses(Protocol):
    """Paused change sets and workspaces as the daemon sees them (rebaser_server.daemon.pauses)."""

    def paused(self, change_set: ChangeSet) -> Pause | None:
        """What holds ``change_set``, as last seen (no round trip)."""

    async def holding(self, change_set: ChangeSet) -> Pause | None:
        """What holds ``change_set`` now (asks the bucket if the view says paused)."""

    async def pause(self, change_set: ChangeSet, pause: Pause) -> None:
        """Store a pause this daemon decided."""


@dataclass(frozen=True, slots=True)
class Report:
    """Where the change-set code says what happened: the daemon's counters, its per-request instrumentation
    (metrics, log context, trace spans) and the named checkpoints tests pause at."""

    stats: Stats
    observe: Observer
    hooks: Hooks


@dataclass
class Placement:
    """Where the daemon stands in the cluster: the shard layout as last read (the shard pullers follow it, and it
    may change while change sets are owned), and ``give_way``: while every slot of this daemon is taken and other
    change sets wait for an owner (``pressure``), which workspaces' idle change sets let go early (quiet.py)."""

    layout: Layout = field(default_factory=Layout)
    give_way: GiveWay = field(default_factory=GiveWay)
    # The NATS servers fsync every write before acknowledging it (as last checked: rebaser_server.ops.durability):
    # a write then costs a disk flush, and removals of processed requests are batched (trimmer.py).
    fsync_always: bool = False
    # Change sets this daemon owns now (each has a consumer on its shard's requests stream).
    owned: int = 0

    @property
    def pressure(self) -> bool:
        """Every slot of this daemon is taken while other change sets wait for an owner."""
        return self.give_way.pressure
