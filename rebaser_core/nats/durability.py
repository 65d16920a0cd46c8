"""What an acknowledged write survives, worked out from what the servers and streams promise. Pure logic: the
reading of servers and streams is :mod:`rebaser_server.ops.durability`'s.

A JetStream acknowledgement means the write is in the storage of a quorum of the stream's replicas. Whether that
storage is the disk or only the page cache depends on the server's ``sync_interval``: with ``always`` every write
is fsynced before it is acknowledged; otherwise the server fsyncs every interval (2 minutes by default), and a
kernel crash or power loss in between loses what the disk has not got yet. Replicas on other machines stand in for
the disk, but only while fewer than a quorum of them lose power at once. So, weakest first:

- ``process-crash``: one replica and interval sync. Survives the server process dying, not the machine.
- ``unknown``: one replica and the sync setting could not be read (no monitoring URL, or it did not answer).
  Treated as ``process-crash`` wherever a floor is asked for.
- ``node-loss``: two or more replicas and interval sync. Survives a crash or power loss of one node, not of all
  of them at once.
- ``power-loss``: every server fsyncs before acknowledging. Survives power loss of all nodes at once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DURABILITY_LEVELS",
    "Durability",
    "DurabilityLevel",
    "ServerSync",
    "assess",
    "check_sync",
    "describe_sync",
    "meets",
    "server_sync_from_varz",
]

DurabilityLevel = Literal["process-crash", "unknown", "node-loss", "power-loss"]
# Weakest first; "unknown" ranks with "process-crash" (nothing better can be shown).
DURABILITY_LEVELS: tuple[DurabilityLevel, ...] = ("process-crash", "unknown", "node-loss", "power-loss")
_RANK: dict[str, int] = {"process-crash": 0, "unknown": 0, "node-loss": 1, "power-loss": 2}

# nats-server's own default, used when a server reports no interval.
DEFAULT_SYNC_INTERVAL = 120.0

# The forms nats-server's config accepts for ``sync_interval`` that the embedded server is given: "always", or a
# Go duration of one or more number-unit pairs ("500ms", "10s", "2m", "1m30s").
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h))+$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def check_sync(value: str) -> str | None:
    """A ``--sync`` value made canonical: ``"always"``, a Go duration (``"10s"``), or None for ``"interval"``
    (nats-server's default of 2 minutes). Raises ValueError for anything else."""
    text = value.strip().lower()
    if text == "always":
        return "always"
    if text in ("interval", "default"):
        return None
    if not _DURATION.match(text) or duration_seconds(text) <= 0:
        raise ValueError(
            f"sync must be 'always', 'interval' or a duration such as 10s or 1m30s, not {value!r}"
        )
    return text


def describe_sync(sync: str | None) -> str:
    """How a server given ``sync`` (as :func:`check_sync` returns it) writes, for people."""
    return "fsync before every acknowledgement" if sync == "always" else f"fsync every {sync or '2m'}"


def duration_seconds(text: str) -> float:
    """Seconds of a Go duration as :func:`check_sync` accepts it."""
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text))


@dataclass(frozen=True)
class ServerSync:
    """One server's fsync policy, as its monitoring endpoint reports it."""

    server: str  # the server's name, or where it was read from
    always: bool
    interval: float  # seconds between fsyncs when not ``always``

    def describe(self) -> str:
        return "always" if self.always else f"every {self.interval:g}s"


def server_sync_from_varz(varz: Mapping[str, Any], source: str) -> ServerSync | None:
    """The sync policy in a ``/varz`` document (None: the server has no JetStream, or says nothing usable)."""
    jetstream = varz.get("jetstream")
    config = jetstream.get("config") if isinstance(jetstream, Mapping) else None
    if not isinstance(config, Mapping):
        return None
    name = varz.get("server_name") or varz.get("server_id") or source
    interval_ns = config.get("sync_interval")
    interval = interval_ns / 1e9 if isinstance(interval_ns, int | float) and interval_ns > 0 else None
    return ServerSync(
        server=str(name),
        always=config.get("sync_always") is True,
        interval=interval if interval is not None else DEFAULT_SYNC_INTERVAL,
    )


@dataclass(frozen=True)
class Durability:
    """What an acknowledged request survives here, and why."""

    level: DurabilityLevel
    sync: str  # "always", "every 120s", "mixed", "unknown"
    min_replicas: int | None  # the fewest replicas of the streams that hold acknowledged data
    servers: tuple[ServerSync, ...] = ()
    replicas: Mapping[str, int] = field(default_factory=dict)  # per stream
    problems: tuple[str, ...] = ()  # what could not be read, and why

    @property
    def survives_power_loss(self) -> bool:
        return self.level in ("node-loss", "power-loss")

    def warning(self) -> str | None:
        """The one line an operator must see when acknowledgements would not survive a power loss (None: they
        would)."""
        if self.survives_power_loss:
            return None
        fix = (
            "set `jetstream { sync_interval: always }` on the NATS servers (or --sync always for the embedded "
            "server), or replicate the streams (replicas >= 3 on a cluster)"
        )
        if self.level == "unknown":
            return (
                "durability unknown: the streams have one replica and the servers' sync setting could not be read "
                f"({'; '.join(self.problems) or 'no --nats-monitoring-url given'}); acknowledged requests may not "
                f"survive a power loss. Give the monitoring URL to have it checked, or {fix}"
            )
        return (
            f"acknowledged requests do not survive a power loss or kernel crash: one replica and the server fsyncs "
            f"{self.sync}; {fix}"
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Durability:
        """A durability as :meth:`as_dict` wrote it (a daemon's finding, read by ``rebaser status``)."""
        servers = []
        for server in data.get("servers") or ():
            sync = str(server.get("sync", ""))
            interval = (
                float(sync.removeprefix("every ").removesuffix("s") or 0) if sync.startswith("every") else 0.0
            )
            servers.append(ServerSync(str(server.get("server", "")), sync == "always", interval))
        return cls(
            level=data["level"],
            sync=str(data.get("sync", "unknown")),
            min_replicas=data.get("min_replicas"),
            servers=tuple(servers),
            replicas={str(k): int(v) for k, v in (data.get("replicas") or {}).items()},
            problems=tuple(str(p) for p in data.get("problems") or ()),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "survives_power_loss": self.survives_power_loss,
            "sync": self.sync,
            "min_replicas": self.min_replicas,
            "servers": [{"server": s.server, "sync": s.describe()} for s in self.servers],
            "replicas": dict(self.replicas),
            "problems": list(self.problems),
        }


def assess(
    servers: Sequence[ServerSync],
    replicas: Mapping[str, int],
    *,
    expected_servers: int = 0,
    problems: Sequence[str] = (),
) -> Durability:
    """The durability of a deployment whose servers fsync as ``servers`` says and whose streams have ``replicas``.

    ``expected_servers``: how many servers there are to read (the monitoring URLs given); ``power-loss`` needs every
    one of them read and fsyncing always.
    """
    min_replicas = min(replicas.values()) if replicas else None
    every_server_read = bool(servers) and len(servers) >= expected_servers
    if not servers:
        sync = "unknown"
    elif all(s.always for s in servers):
        sync = "always" if every_server_read else "unknown"
    elif not any(s.always for s in servers):
        slowest = max(s.interval for s in servers)
        sync = f"every {slowest:g}s"
    else:
        sync = "mixed"
    level: DurabilityLevel
    if sync == "always":
        level = "power-loss"
    elif min_replicas is not None and min_replicas >= 2:
        level = "node-loss"
    elif sync == "unknown":
        level = "unknown"
    else:
        level = "process-crash"
    return Durability(
        level=level,
        sync=sync,
        min_replicas=min_replicas,
        servers=tuple(servers),
        replicas=dict(replicas),
        problems=tuple(problems),
    )


def meets(level: DurabilityLevel, floor: str) -> bool:
    """Does ``level`` satisfy the floor an operator asked for (``"none"`` always does)?"""
    if floor == "none":
        return True
    return _RANK[level] >= _RANK[floor]
