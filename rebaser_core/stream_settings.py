"""The streams' tunables: the deployment's prefix, and the replicas, storage, caps and ages of its streams.

They are fields of :class:`rebaser_core.settings.Settings` like every other tunable (``Settings`` is a
:class:`StreamSettings`), set the same ways; this module only declares them, and checks the prefix. Durations are
seconds; ``-1`` in a cap is no cap.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rebaser_core.subjects import validate_prefix

__all__ = ["StreamSettings"]


class StreamSettings(BaseModel):
    """The first fields of :class:`~rebaser_core.settings.Settings`, in its order: the prefix, then the streams."""

    # No NaN or infinity in any duration or size: an infinite ack_wait or timeout never comes.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    prefix: str | None = Field(
        None, description="Subject/stream prefix isolating one deployment (or one test)."
    )

    # -- streams -----------------------------------------------------------------------------------
    replicas: int = Field(1, ge=1, le=5, description="Replicas of every stream and of the tasks consumer.")
    storage: Literal["file", "memory"] = Field("file", description="Storage of the streams.")
    duplicate_window: float = Field(
        120.0, gt=0, description="Window in which a repeated Nats-Msg-Id is dropped."
    )
    # Message caps cost nothing until reached; a byte cap is reserved up front by nats-server against its
    # max_memory_store / max_file_store, so it is left to the operator (docs/capacity.md#bounds).
    requests_max_msgs: int = Field(
        1_000_000, ge=-1, description="Cap on queued requests in total, over every shard (-1: unlimited)."
    )
    requests_max_bytes: int = Field(
        -1, ge=-1, description="Cap on queued request bytes in total, over every shard (-1: unlimited)."
    )
    requests_max_msgs_per_change_set: int = Field(
        -1, description="Cap on one change set's backlog (-1: none)."
    )
    workspace_max_requests: int = Field(
        100_000,
        ge=-1,
        description="Cap on one workspace's queued requests, over every shard, checked by clients before they "
        "publish (-1: none; docs/capacity.md#bounds).",
    )
    tasks_max_msgs: int = Field(
        1_000_000,
        ge=-1,
        description="Cap on tasks (change sets waiting for or held by an owner) over every shard (-1: unlimited).",
    )
    tasks_max_bytes: int = Field(
        -1, ge=-1, description="Cap on the tasks streams' bytes over every shard (-1: unlimited)."
    )
    requests_max_age: float = Field(0.0, ge=0, description="Requests older than this are dropped (0: never).")
    dead_letter_max_age: float = Field(14 * 86400.0, ge=0, description="How long dead letters are kept.")
    dead_letter_max_bytes: int = Field(
        256 * 1024 * 1024,
        ge=-1,
        description="Bytes of dead letters kept; the oldest go first (-1: unlimited).",
    )
    dead_letter_max_msgs: int = Field(
        100_000, ge=-1, description="Dead letters kept; the oldest go first (-1: unlimited)."
    )
    dead_letter_max_per_change_set: int = Field(
        100,
        ge=-1,
        description="Dead letters kept per change set (the stream's max_msgs_per_subject); its oldest go first, so a "
        "flood of refusals in one change set evicts only that change set's letters (-1: unlimited).",
    )
    dead_letter_max_per_workspace: int = Field(
        1_000,
        ge=-1,
        description="Dead letters kept per workspace; once over it, the daemon that dead-letters purges the "
        "workspace's oldest, so a workspace's flood of refusals evicts only its own letters (-1: unlimited; "
        "docs/capacity.md#bounds).",
    )
    dead_letter_max_body: int = Field(
        64 * 1024, ge=0, description="A dead letter keeps at most this many bytes of the request's body."
    )
    on_max_attempts: Literal["dead_letter", "pause"] = Field(
        "dead_letter",
        description="After a request failed max_attempts times: dead-letter it and go on with the next one, or pause "
        "the change set with the request first in line (docs/pausing.md).",
    )
    events_window: int = Field(
        16,
        ge=0,
        le=64,
        description="A change set's last durable events that every write of its record carries, for its followers "
        "(docs/events.md): a follower more events behind than this loses some. 0: no event feed.",
    )
    events: bool = Field(
        False,
        description="Also publish every change set's events and notices to the REBASER_EVENTS stream, for followers "
        "of releases before the record feed (docs/events.md). Off by default: it costs 8 to 21 % of the "
        "throughput of a busy daemon (docs/BENCHMARKS.md).",
    )
    events_max_age: float = Field(
        24 * 3600.0, ge=0, description="How long events are kept for followers to catch up (0: for ever)."
    )
    events_max_per_change_set: int = Field(
        1000,
        ge=1,
        description="Messages kept per change set in REBASER_EVENTS (events and notices); the oldest go first.",
    )
    # Stored update batches (REBASER_STORED_BATCHES, docs/protocol.md §14). A part is at most 256 KiB, so a message
    # cap bounds the bytes too, without the up-front reservation a byte cap costs.
    stored_batches_max_age: float = Field(
        24 * 3600.0,
        ge=0,
        description="A stored batch is deleted this long after it was written (0: never); a request naming it after "
        "that is refused (its batch does not exist).",
    )
    stored_batches_max_msgs: int = Field(
        8_192,
        ge=-1,
        description="Messages (parts of 256 KiB at most, and manifests) of every workspace's stored batches "
        "together: 2 GiB at most per replica. Once full, storing a batch is refused with RebaserBusy (-1: none).",
    )
    stored_batches_max_bytes: int = Field(
        -1,
        ge=-1,
        description="Bytes of every workspace's stored batches together; reserved up front by nats-server "
        "(-1: none, stored_batches_max_msgs bounds them).",
    )
    stored_batches_max_msgs_per_workspace: int = Field(
        512,
        ge=-1,
        description="Messages of one workspace's stored batches (128 MiB at most); over it, the daemons' batch "
        "sweep deletes the workspace's oldest batches, so one workspace cannot fill the stream others share (-1: "
        "none; docs/capacity.md#bounds).",
    )
    stored_batch_unfinished_age: float = Field(
        600.0,
        gt=0,
        description="Parts of a batch whose manifest has not come this long after the batch sweep first saw them "
        "are deleted (a batch being written takes seconds).",
    )
    stored_batches_sweep_interval: float = Field(
        30.0,
        gt=0,
        description="How often a daemon sweeps the stored batches (unfinished ones, workspaces' shares).",
    )
    max_active_change_sets: int = Field(
        10_000,
        ge=1,
        description="Cluster-wide cap on change sets owned at once (tasks consumer max_ack_pending).",
    )

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str | None) -> str | None:
        return validate_prefix(value)
