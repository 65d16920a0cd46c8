"""The shard layout: how many request/task streams a deployment has, and which shard a change set is in.

Pure and NATS-free (the cluster's copy lives in a KV entry: :mod:`rebaser_core.nats.layout_store`).

A change set maps to a shard by a stable hash of ``<workspace>.<change_set>``, so all of its requests go to one
shard, in order. The hash is blake2b, not Python's ``hash()`` (salted per process) and not CRC (a client in another
language can compute blake2b-64 too): every client and daemon, in any process, agrees.

While the number of shards changes, the layout keeps the previous number (``previous``): a change set whose shard
moved may still have requests queued in its old shard, and those are applied before any in its new shard
(see ``docs/operations.md``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Any, Literal

from rebaser_core.errors import LayoutMismatch, LayoutUnreadable

__all__ = [
    "INTAKES",
    "LANES",
    "LAYOUT_REPAIR",
    "MAX_LANES",
    "MAX_STREAMS",
    "AssignmentMode",
    "Intake",
    "Layout",
    "ordinal_from_hostname",
    "pinned_shards",
    "shard_of",
]

AssignmentMode = Literal["shared", "pinned"]
MODES: tuple[AssignmentMode, ...] = ("shared", "pinned")
# How tasks reach daemons (docs/fair-share.md): "fifo", one consumer per shard shared by every daemon, hands tasks out
# in the order they came; "fair", one consumer per workspace with tasks, served by every daemon in turns; "lanes", the
# workspaces hashed onto LANES consumers per shard, the lanes served in turns (docs/design.md §7).
Intake = Literal["fifo", "fair", "lanes"]
INTAKES: tuple[Intake, ...] = ("fifo", "fair", "lanes")
# Lanes per shard with the lanes intake: consumers (Raft groups on a replicated cluster) per shard, whatever the number
# of workspaces; a workspace shares its lane's order with 1/LANES of the others.
LANES = 32
# Lanes per shard a deployment may be made with (Settings.lanes): nats-server's partition() transform takes any
# count, but each lane is a consumer (a Raft group on a replicated cluster) and a pull waiting in every daemon.
MAX_LANES = 256
# A shard is at least two streams and a consumer; far more than the servers of any cluster is only overhead.
MAX_STREAMS = 64
# The command that rewrites an unreadable layout entry (rebaser_client.admin.store_repairs), named where one is met.
LAYOUT_REPAIR = "`rebaser streams repair`"
_ORDINAL = re.compile(r"-(\d+)$")


def shard_of(workspace_id: object, change_set_id: object, streams: int) -> int:
    """The shard of a change set among ``streams`` shards: blake2b-64 of ``"<workspace>.<change_set>"`` mod N.

    Ids are hashed in their canonical (upper-case) form, the form they have in subjects."""
    if streams < 1:
        raise ValueError(f"streams must be >= 1, got {streams}")
    if streams == 1:
        return 0
    key = f"{str(workspace_id).upper()}.{str(change_set_id).upper()}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") % streams


def pinned_shards(index: int, daemons: int, streams: int) -> list[int]:
    """The shards daemon ``index`` of ``daemons`` serves in pinned mode: index, index + R, index + 2R, ...

    More daemons than shards would leave a daemon without a shard: refused, as is an index outside 0..R-1."""
    if daemons < 1:
        raise LayoutMismatch(f"--daemons must be >= 1, got {daemons}")
    if daemons > streams:
        raise LayoutMismatch(
            f"pinned mode: {daemons} daemons but only {streams} streams; every daemon needs a shard of its own "
            f"(raise the streams with 'rebaser streams set {daemons}' or run fewer daemons)"
        )
    if not 0 <= index < daemons:
        raise LayoutMismatch(f"replica index {index} is outside 0..{daemons - 1} (--daemons {daemons})")
    return list(range(index, streams, daemons))


def ordinal_from_hostname(hostname: str) -> int | None:
    """A StatefulSet-style ordinal: ``rebaser-2`` is 2; None if the name does not end in ``-<digits>``."""
    match = _ORDINAL.search(hostname.split(".", 1)[0])
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class Layout:
    """The deployment's shard layout (one KV entry, written once, changed only by ``rebaser streams set``)."""

    streams: int = 1
    mode: AssignmentMode = "shared"
    # The number of shards before the last change, while its shards may still hold requests; None once drained.
    previous: int | None = None
    # Bumped by every change: lets a watcher tell a new layout from a repeat.
    epoch: int = 0
    # How tasks reach daemons (a new deployment's is "lanes"); a layout written before there was a choice is "fifo".
    intake: Intake = "fifo"
    # While the intake changes (``rebaser streams intake``): the one being left. No daemon takes a task meanwhile.
    intake_from: Intake | None = None
    # Lanes per shard with the lanes intake, fixed when the layout is made (Settings.lanes; LANES in a layout written
    # before it could be chosen): the tasks stream's transform, the consumers and every daemon's hash agree on it.
    lane_count: int = LANES

    def __post_init__(self) -> None:
        if not 1 <= self.streams <= MAX_STREAMS:
            raise ValueError(f"streams must be between 1 and {MAX_STREAMS}, got {self.streams}")
        if self.mode not in MODES:
            raise ValueError(f"assignment mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.intake not in INTAKES:
            raise ValueError(f"intake must be one of {', '.join(INTAKES)}, got {self.intake!r}")
        if self.intake_from is not None and self.intake_from not in INTAKES:
            raise ValueError(f"intake_from must be one of {', '.join(INTAKES)}, got {self.intake_from!r}")
        if not 1 <= self.lane_count <= MAX_LANES:
            raise ValueError(f"lanes must be between 1 and {MAX_LANES}, got {self.lane_count}")
        if self.previous is not None and not 1 <= self.previous <= MAX_STREAMS:
            raise ValueError(f"previous streams must be between 1 and {MAX_STREAMS}, got {self.previous}")

    @property
    def migrating(self) -> bool:
        return self.previous is not None and self.previous != self.streams

    @property
    def switching_intake(self) -> bool:
        """The intake changes: the daemons have let go of what they held, and take nothing until it is done."""
        return self.intake_from is not None

    @property
    def shared_consumer(self) -> bool:
        """Whether each shard has the shared tasks consumer (the fifo intake, not while the intake changes)."""
        return self.intake == "fifo" and self.intake_from is None

    @property
    def lanes(self) -> int:
        """Lanes per shard the tasks stream stores its tasks under (its subject transform): ``lane_count`` with the
        lanes intake, from the moment the change to it begins until the change away from it begins; else 0."""
        return self.lane_count if self.intake == "lanes" else 0

    @property
    def lane_consumers(self) -> bool:
        """Whether each shard has the lanes' consumers (the lanes intake, not while the intake changes)."""
        return self.intake == "lanes" and self.intake_from is None

    def changed_intake(self, intake: Intake) -> Layout:
        """The layout once ``rebaser streams intake`` began: the current intake is the one being left."""
        return replace(self, intake=intake, intake_from=self.intake, epoch=self.epoch + 1)

    def intake_settled(self) -> Layout:
        """The layout once the old intake's consumers are gone and their leases have run out."""
        return replace(self, intake_from=None, epoch=self.epoch + 1)

    @property
    def shards(self) -> range:
        """Every shard that may hold work: the current ones, and while migrating also the previous ones."""
        return range(max(self.streams, self.previous or 0))

    def shard_of(self, workspace_id: object, change_set_id: object) -> int:
        """Where new requests of the change set go."""
        return shard_of(workspace_id, change_set_id, self.streams)

    def old_shard_of(self, workspace_id: object, change_set_id: object) -> int | None:
        """While migrating: the change set's shard under the previous layout, if it differs from its new one."""
        if not self.migrating or self.previous is None:
            return None
        old = shard_of(workspace_id, change_set_id, self.previous)
        return None if old == self.shard_of(workspace_id, change_set_id) else old

    def changed_to(self, streams: int) -> Layout:
        """The layout after ``rebaser streams set <streams>``: the current shards become the draining ones."""
        return replace(self, streams=streams, previous=self.streams, epoch=self.epoch + 1)

    def settled(self) -> Layout:
        """The layout once the previous shards have drained."""
        return replace(self, previous=None, epoch=self.epoch + 1)

    def check_flags(
        self, streams: int | None, mode: AssignmentMode | None, who: str, intake: Intake | None = None
    ) -> None:
        """A client's or daemon's flags must agree with the cluster's layout: a clear error, never mis-routing."""
        if streams is not None and streams != self.streams:
            raise LayoutMismatch(
                f"{who} was started with --streams {streams} but the cluster's layout has {self.streams} "
                f"streams; drop the flag (the layout is read from the cluster) or change the layout with "
                f"'rebaser streams set {streams}'"
            )
        if mode is not None and mode != self.mode:
            raise LayoutMismatch(
                f"{who} was started with --assignment {mode} but the cluster's layout says {self.mode}; drop "
                f"the flag or change the layout with 'rebaser streams set {self.streams} --assignment {mode}'"
            )
        if intake is not None and intake != self.intake:
            raise LayoutMismatch(
                f"{who} was started with --intake {intake} but the cluster's layout says {self.intake}; drop the "
                f"flag (a deployment's intake is chosen when its layout is created, docs/fair-share.md)"
            )

    # -- the KV value ---------------------------------------------------------------------------------------
    def encode(self) -> bytes:
        return json.dumps(
            {
                "streams": self.streams,
                "mode": self.mode,
                "previous": self.previous,
                "epoch": self.epoch,
                "intake": self.intake,
                "intake_from": self.intake_from,
                "lanes": self.lane_count,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> Layout:
        try:
            raw: Any = json.loads(data)
            return cls(
                streams=int(raw["streams"]),
                mode=raw.get("mode", "shared"),
                previous=None if raw.get("previous") is None else int(raw["previous"]),
                epoch=int(raw.get("epoch", 0)),
                intake=raw.get("intake", "fifo"),
                intake_from=raw.get("intake_from"),
                lane_count=int(raw.get("lanes", LANES)),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise LayoutUnreadable(
                f"the cluster's layout entry is unreadable ({err}): {data[:200]!r}; {LAYOUT_REPAIR} rewrites it "
                "from the streams that exist"
            ) from None
