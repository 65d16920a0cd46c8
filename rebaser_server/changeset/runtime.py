"""What every change-set processor of one daemon shares: connection, settings, app, store, hooks, stats."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rebaser_core.layout import Layout
from rebaser_core.requester import Requester
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.app import ChangeSet, RebaserApp
from rebaser_server.changeset.hooks import Hooks
from rebaser_server.ops.observe import Observer
from rebaser_server.record.direct_reads import DirectReads
from rebaser_server.record.store import ChangeSetStore
from rebaser_server.task.keeper import LeaseKeeper

__all__ = ["Runtime", "Stats"]

log = logging.getLogger(__name__)


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
    request_commits: int = 0  # record commits for requests: fewer than requests when group commits form
    requests_replayed: int = 0
    requests_dead_lettered: int = 0
    dead_letter_failures: int = 0  # dead-letter copies given up (refused twice, or the stream unreachable)
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
    dvu_runs: int = 0
    dvu_failures: int = 0
    nats_reconnects: int = 0
    # Owned change sets handed back after a reconnect (their ordered consumers may be gone).
    reconnect_handbacks: int = 0
    # Owned change sets' request consumers replaced after a lost delivery or a silence (consumer.py).
    consumer_resets: int = 0
    # Wall clock: the last request answered, and the last write JetStream acknowledged (a purge of processed
    # requests; see trimmer.py).
    last_request_at: float | None = None
    last_publish_at: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return dict(self.__dict__)


@dataclass
class Runtime:
    nc: NatsClient
    js: JetStreamContext
    settings: Settings
    app: RebaserApp
    store: ChangeSetStore
    owner: str
    hooks: Hooks = field(default_factory=Hooks)
    stats: Stats = field(default_factory=Stats)
    # Every slot of this daemon is taken while other change sets wait for an owner: idle change sets let go early.
    pressure: bool = False
    # Per-request metrics (the daemon's own Prometheus registry), log context and tracing: rebaser_server.ops.observe.
    observe: Observer = field(default_factory=Observer)
    # The cluster's shard layout as last read (rebaser_server.daemon.shards follows it).
    layout: Layout = field(default_factory=Layout)
    # Renews every owned change set's lease and runs their watchdog (one loop per daemon).
    keeper: LeaseKeeper = field(init=False)
    # Request-reply for the per-request hot paths (commits, purges): rebaser_core.requester.
    requester: Requester = field(init=False)
    # Reads of a stream's last message as its leader has it (rebaser_server.record.direct_reads).
    reads: DirectReads = field(init=False)
    # Shard 0's names, and everything shards share (dead letters, records, queries). Made once: every request
    # asks for them, and Settings.subjects builds (and validates) a new one each time.
    subjects: Subjects = field(init=False)

    def __post_init__(self) -> None:
        self.requester = self.store.requester or Requester(self.nc)
        self.reads = self.store.reads or DirectReads(self.requester, self.settings.nats_timeout)
        self.subjects = self.settings.subjects

        def renewed() -> None:
            self.stats.lease_renewals += 1

        self.keeper = LeaseKeeper(self.nc, period=self.settings.progress_period, on_renewed=renewed)

    def shard_subjects(self, change_set: ChangeSet) -> Subjects:
        """The names of the shard new requests of ``change_set`` go to."""
        return self.subjects.for_shard(
            self.layout.shard_of(change_set.workspace_id, change_set.change_set_id)
        )

    async def queued(
        self, change_set: ChangeSet, *, from_leader: bool = False, subjects: Subjects | None = None
    ) -> bool:
        """Is any request of this change set still in the stream (of shard ``subjects``, default shard 0)? One
        get, no consumer involved.

        A direct get may be answered by any replica, which can lag behind the leader: ``from_leader`` asks the
        stream leader (where a decision must not miss a request just written, as after a release), by a direct get
        where only the leader can answer one (rebaser_server.record.direct_reads)."""
        names = subjects or self.subjects
        subject = names.requests(change_set.workspace_id, change_set.change_set_id)
        if from_leader:
            # Over the light requester (this runs at every release), as the leader has it: by direct get where only
            # the leader can answer one (a quarter of the server's work), else STREAM.MSG.GET.
            last = await self.reads.last_message(
                names.requests_stream, subject, timeout=self.settings.nats_timeout
            )
            return last is not None
        try:
            await self.js.get_last_msg(names.requests_stream, subject, direct=True)
        except NotFoundError:
            return False
        return True
