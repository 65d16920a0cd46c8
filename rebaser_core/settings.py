"""Every tunable in one place, with the defaults an operator can rely on.

Durations are seconds. ``Settings()`` gives the production defaults; tests shrink the periods. Every field can
also be set from the environment as ``REBASER_<FIELD>`` (upper case) via :meth:`Settings.from_env`. The first
fields, the deployment's prefix and its streams' replicas, storage, caps and ages, are declared in
:mod:`rebaser_core.stream_settings` (``Settings`` is a ``StreamSettings``); the rest are here.

How the limits fit together (docs/design.md §4): each active change set holds one unacked task on the shared
tasks consumer *and* one ordered consumer on ``REBASER_REQUESTS``. So ``max_active_change_sets`` becomes both
the tasks consumer's ``max_ack_pending`` (a cluster-wide cap: once that many tasks are out, no daemon gets another
until one is released) and, plus headroom, the requests stream's ``max_consumers``. A daemon owns at most
``concurrency`` change sets; the cluster serves at most ``min(max_active_change_sets, daemons * concurrency)``.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rebaser_core.batches import MAX_BATCH_BYTES, MAX_BATCH_UPDATES
from rebaser_core.errors import InvalidReplyInbox
from rebaser_core.inbox import DEFAULT_INBOX_PREFIX, check_inbox_prefix
from rebaser_core.layout import LANES, MAX_LANES
from rebaser_core.stream_settings import StreamSettings
from rebaser_core.subjects import Subjects

__all__ = ["Settings"]


class Settings(StreamSettings):
    # The model's configuration (frozen, no extra field, no NaN or infinity) is StreamSettings'.

    # -- shards (docs/operations.md) -----------------------------------------------------------------------
    streams: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Shards of requests and tasks. The cluster's layout (a KV entry) is authoritative: this only "
        "creates it (none: 1) or must agree with it.",
    )
    assignment: Literal["shared", "pinned"] | None = Field(
        None,
        description="shared: every daemon pulls every shard; pinned: daemon i of --daemons R serves shards i, "
        "i+R, ... (none: the layout's, or shared).",
    )
    intake: Literal["fifo", "fair", "lanes"] | None = Field(
        None,
        description="How tasks reach daemons: fifo, one consumer per shard hands them out in the order they came; "
        "fair, one consumer per workspace with tasks, the workspaces served in turns; lanes, the workspaces hashed "
        "onto 32 consumers per shard, each pulled on its own (docs/fair-share.md). Chosen when the layout is "
        "created (none: the layout's, or lanes).",
    )
    lanes: int = Field(
        LANES,
        ge=1,
        le=MAX_LANES,
        description="Lanes per shard of a new deployment's layout (the lanes intake: a consumer per lane, and a pull "
        "waiting in every daemon). Fixed when the layout is created; a daemon given another count follows the "
        "layout's.",
    )
    workspace_weights: tuple[tuple[str, int], ...] = Field(
        (),
        description="Fair intake: a workspace's share of the tasks taken while others wait, relative to the "
        "default 1 (REBASER_WORKSPACE_WEIGHTS=wk1=4,wk2=2).",
    )
    daemons: int | None = Field(None, ge=1, description="Pinned mode: how many daemons share the shards (R).")
    replica_index: int | None = Field(
        None,
        ge=0,
        description="Pinned mode: this daemon's index 0..R-1 (none: the hostname's ordinal, rebaser-2 is 2).",
    )

    # -- task ownership ------------------------------------------------------------------------------
    ack_wait: float = Field(
        2.5,
        gt=0,
        description="A silent owner loses its task after this long: how long a dead daemon's change sets stall.",
    )
    progress_period: float = Field(
        0.5, gt=0, description="How often a live owner renews its lease (a confirmed progress ack)."
    )
    # 60 s, not the original design's 300 s: holding an idle change set costs its lease renewals (about 30 µs of
    # nats-server and 30 µs of daemon CPU a second, bench/bench.py's idle scenario), taking it again costs one cold
    # activation (about 2.5 ms of CPU in all, a few ms on its next request). Holding for as long as holding costs
    # what a new activation would is the rent-or-buy answer: never more than twice the best choice in hindsight.
    lease_mode: Literal["task", "daemon"] = Field(
        "task",
        description="task: every owned change set's lease is renewed every progress_period; daemon: one heartbeat "
        "per daemon every progress_period, each task renewed every quarter of task_ack_wait, and a silent daemon's "
        "peers hand its tasks back after ack_wait (docs/capacity.md). Every daemon of a deployment uses the same.",
    )
    task_ack_wait: float = Field(
        60.0,
        gt=0,
        description="lease_mode daemon: the tasks consumer's ack_wait, how long a task stalls if no peer hands it "
        "back (its owner died with no other daemon running).",
    )
    quiescent_period: float = Field(
        60.0, gt=0, description="Release a change set after this long without work."
    )
    handler_deadline: float = Field(
        120.0,
        gt=0,
        description="A single apply or DVU step running longer than this is wedged: give up the task.",
    )
    concurrency: int = Field(500, ge=1, description="Change sets one daemon owns at once.")
    max_owned_per_workspace: int = Field(
        0,
        ge=0,
        description="Change sets of one workspace this daemon owns at once while another workspace has tasks; a "
        "task over it goes back to the stream with a growing delay (0: half of concurrency, so one workspace's flood "
        "leaves the other half to the rest, and a workspace alone still gets every slot; docs/fair-share.md).",
    )
    start_concurrency: int = Field(
        128,
        ge=1,
        description="Change sets one daemon takes on at once (record, consumer, until the first request arrives); "
        "further tasks wait in the server, where no lease runs out.",
    )
    consumer_heartbeat: float = Field(
        5.0,
        ge=0.1,
        le=3600,
        description="Idle heartbeat of an owned change set's request consumer; one silent for more than two "
        "heartbeats is replaced, starting after the last request taken.",
    )
    retry_backoff: float = Field(1.0, gt=0, description="First redelivery delay after a retryable failure.")
    retry_backoff_max: float = Field(60.0, gt=0, description="Cap on the redelivery delay.")
    max_attempts: int = Field(
        5,
        ge=1,
        description="Retryable failures of one request before it is dead-lettered; also daemons that died or froze "
        "with it in hand, after the first.",
    )
    nats_timeout: float = Field(
        5.0, gt=0, description="How long one JetStream API call (commit, purge, dead letter, ack) may take."
    )
    sweep_interval: float = Field(
        30.0, gt=0, description="How often orphaned requests (no task) are looked for."
    )
    removal_linger: float = Field(
        0.5,
        ge=0,
        le=10,
        description="While the NATS servers fsync every write, processed requests wait up to this long to be "
        "removed from the stream together, one write for a batch (0: each at once).",
    )
    shutdown_grace: float = Field(
        10.0, ge=0, description="On SIGTERM, how long the request in hand may finish."
    )
    dvu_max_delay: float = Field(
        1.0,
        ge=0,
        description="A due DVU waits for a lull in requests (coalescing a burst into few runs), at most this long.",
    )
    idempotency_window: int = Field(
        64,
        ge=8,
        description="Recent request ids (with replies) remembered per change set to make re-apply a no-op.",
    )
    gc_threshold: int = Field(
        100_000,
        ge=0,
        le=100_000_000,
        description="The daemon process's generation-0 garbage-collection threshold (0: Python's own, 700); the "
        "daemon also freezes what start-up allocated. Python's default spent a third of a busy daemon's time in "
        "collections (docs/operations.md, Memory and garbage collection).",
    )

    event_loop: Literal["asyncio", "uvloop"] = Field(
        "asyncio",
        description="The daemon process's event loop: Python's own, or uvloop (installed with the `uvloop` extra).",
    )

    # -- hostile input --------------------------------------------------------------------------------------
    reply_inbox_prefix: str = Field(
        DEFAULT_INBOX_PREFIX,
        description="Replies go only to inboxes under this prefix (nats-py's default; see rebaser_core.inbox).",
    )

    # -- queries ---------------------------------------------------------------------------------------------
    settled_max_waits_per_workspace: int = Field(
        100,
        ge=1,
        description="settled queries of one workspace one daemon holds at once (of its 1,000); one over it is looked "
        "at once and answered, settled or 'ask again', without being held.",
    )
    follow_creates_per_minute: int = Field(
        120,
        ge=1,
        description="Event followers' consumers one daemon makes for one workspace in a minute; past it a follower's "
        "request is refused (it tries again later: nats-py recreates a lost consumer every few seconds).",
    )

    # -- health (the daemon's /readyz) ----------------------------------------------------------------------
    ready_max_backlog: int = Field(
        10_000,
        ge=-1,
        description="Not ready while more requests than this wait in REBASER_REQUESTS (-1: never for backlog).",
    )
    ready_max_disconnected: float = Field(
        30.0, gt=0, description="Not ready once NATS has been unreachable for longer than this."
    )

    # -- durability (docs/RELIABILITY.md, "What an acknowledgement survives") -------------------------------------
    nats_monitoring_urls: tuple[str, ...] = Field(
        (),
        description="HTTP monitoring endpoints of the NATS servers (http://host:8222), one per server: where the "
        "daemon reads their sync setting at start-up and after every reconnect (none: unknown, or the embedded "
        "server's own).",
    )
    require_durability: Literal["none", "node-loss", "power-loss"] = Field(
        "none",
        description="Refuse to serve unless acknowledged requests survive at least this: node-loss (a node's crash "
        "or power loss: replicas >= 2 or fsync always) or power-loss (every server fsyncs before acknowledging).",
    )

    # -- limits of the built-in snapshot app (docs/protocol.md, "Limits") ----------------------------------------
    # Over a limit, a request is refused (error reply, dead letter) and a computed value becomes an error value:
    # no message may make a daemon compute or hold without bound.
    max_updates_per_request: int = Field(
        MAX_BATCH_UPDATES, ge=1, description="Updates in one request, inline or stored."
    )
    max_stored_batch_bytes: int = Field(
        MAX_BATCH_BYTES, ge=1, description="Size of a stored batch (checked before it is downloaded)."
    )
    max_value_bytes: int = Field(
        1024 * 1024,
        ge=1,
        description="A literal or computed value, as compact JSON. A function whose arguments add up to more "
        "than 4 times this is not called (error value).",
    )
    max_snapshot_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1,
        description="A change set's snapshot, as stored (compact JSON). Decoding one holds the GIL: about "
        "0.3 s for 32 MiB.",
    )
    max_snapshot_attributes: int = Field(100_000, ge=1, description="Attributes in one snapshot.")
    snapshot_inline_bytes: int = Field(
        16 * 1024,
        ge=0,
        le=64 * 1024,
        description="A snapshot of at most this many bytes is kept in its change set's record instead of the "
        "snapshots object store: one write per commit instead of three (0: always the object store).",
    )

    @field_validator("workspace_weights", mode="before")
    @classmethod
    def _parse_weights(cls, value: object) -> object:
        # From REBASER_WORKSPACE_WEIGHTS ("wk1=4,wk2=2"), or a config file's table {wk1 = 4}: pairs, upper-case ids.
        if isinstance(value, str):
            pairs = []
            for item in value.replace(",", " ").split():
                workspace, sep, weight = item.partition("=")
                if not sep or not weight.strip().isdigit():
                    raise ValueError(f"a workspace weight is <workspace>=<whole number>, not {item!r}")
                pairs.append((workspace.strip(), int(weight)))
            value = pairs
        if isinstance(value, dict):
            value = list(value.items())
        if isinstance(value, (list, tuple)):
            return tuple(sorted((str(wk).upper(), weight) for wk, weight in value))
        return value

    @field_validator("workspace_weights")
    @classmethod
    def _check_weights(cls, value: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
        for workspace, weight in value:
            if not 1 <= weight <= 1000:
                raise ValueError(f"workspace {workspace}'s weight must be between 1 and 1000, got {weight}")
        return value

    @field_validator("nats_monitoring_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: object) -> object:
        # From REBASER_NATS_MONITORING_URLS or a config file's string: separated by spaces or commas.
        if isinstance(value, str):
            return tuple(value.replace(",", " ").split())
        return value

    @field_validator("nats_monitoring_urls")
    @classmethod
    def _check_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"a monitoring URL starts with http:// or https://, not {url!r}")
        return tuple(url.rstrip("/") for url in value)

    @model_validator(mode="after")
    def _progress_below_ack_wait(self) -> Settings:
        # A confirmed renewal extends the lease from the renewal confirmed before it (rebaser_server/task/lease.py), so
        # a lease runs ack_wait less its margin (0.2 x) from a renewal sent a period before the last one. Two more
        # renewals must fit in what is left (0.8 x ack_wait - period >= 2 x period), so one lost or slow renewal
        # does not cost the task: at most a quarter of ack_wait.
        if self.progress_period > 0.25 * self.ack_wait:
            raise ValueError(
                "progress_period must be at most 0.25 x ack_wait (two lease renewals in what a renewal leaves)"
            )
        if self.retry_backoff > self.retry_backoff_max:
            raise ValueError("retry_backoff must not exceed retry_backoff_max")
        try:
            check_inbox_prefix(self.reply_inbox_prefix, self.subjects)
        except InvalidReplyInbox as err:
            raise ValueError(str(err)) from None
        return self

    @property
    def lease_margin(self) -> float:
        """How long before the server may redeliver a task its owner stops acting on it (see lease.py): room for
        an ack in flight and for cancelling a step."""
        return 0.2 * self.ack_wait

    @property
    def consumer_ack_wait(self) -> float:
        """The tasks consumer's ``ack_wait``: ``ack_wait`` itself, or with ``lease_mode`` daemon the longer
        ``task_ack_wait`` (the daemon's heartbeat and its peers bound a dead daemon's stall to ``ack_wait``)."""
        return self.ack_wait if self.lease_mode == "task" else max(self.task_ack_wait, self.ack_wait)

    @property
    def task_renewal_period(self) -> float:
        """How often each owned task's delivery is renewed: ``progress_period``, or a quarter of
        ``consumer_ack_wait`` with ``lease_mode`` daemon."""
        return self.progress_period if self.lease_mode == "task" else 0.25 * self.consumer_ack_wait

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.prefix)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from ``REBASER_*`` environment variables, then ``overrides`` (non-None values win)."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = env.get(f"REBASER_{name.upper()}")
            if raw is not None:
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
