"""The ``/status`` document of one daemon; ``ready`` and ``not_ready`` in it are what ``/readyz`` answers from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rebaser_server.ops.view import DaemonView

__all__ = ["STATUS_MAX_OWNED", "status_of"]

# /status lists at most this many owned change sets by name (the count is always exact).
STATUS_MAX_OWNED = 100


async def status_of(daemon: DaemonView) -> dict[str, Any]:
    """Everything ``/status`` shows."""
    health, settings, layout = daemon.health, daemon.settings, daemon.layout
    facts, stale = await health.facts()
    owned = daemon.owned
    intake = daemon.intake_status()
    reasons = health.not_ready(
        facts,
        stale,
        stopping=daemon.stopping,
        serving=daemon.serving,
        owned=len(owned),
        workspaces_waiting=int(intake.get("workspaces_waiting_total") or 0),
    )
    stats = daemon.stats.as_dict()
    return {
        "owner": daemon.owner,
        "prefix": settings.prefix,
        "layout": {
            "streams": layout.streams,
            "mode": layout.mode,
            "previous": layout.previous,
            "epoch": layout.epoch,
            "intake": layout.intake,
            "served_shards": list(daemon.served_shards),
        },
        "ready": not reasons,
        "not_ready": reasons,
        "problems": dict(health.problems),  # what an operator must repair (each also a not_ready reason)
        "alive": daemon.alive() is None,
        "stopping": daemon.stopping,
        "nats": health.connection(),
        "owned": {
            "count": len(owned),
            "concurrency": settings.concurrency,
            "starting": daemon.starting,
            "start_concurrency": settings.start_concurrency,
            "change_sets": [str(cs) for cs in owned[:STATUS_MAX_OWNED]],
            # The busiest workspaces here, and the share each may have (max_owned_per_workspace).
            "by_workspace": top_workspaces(daemon.owned_by_workspace),
            "workspace_share": daemon.workspace_share,
            # Tasks taken lately (halved every minute) by the workspaces served most, and by all: the share served.
            "served_by_workspace": top_workspaces(daemon.served_by_workspace),
            "served_total": sum(daemon.served_by_workspace.values()),
            # Tasks in the streams of the busiest workspaces: owned (here or elsewhere) or waiting for an owner.
            "tasks_by_workspace": top_workspaces(daemon.tasks_by_workspace()),
        },
        "intake": dict(intake),
        # How ownership is kept (docs/capacity.md): every task's lease, or one heartbeat per daemon.
        "leases": {"mode": settings.lease_mode, "task_ack_wait": settings.consumer_ack_wait},
        "jetstream": health.facts_dict(facts, stale),
        "durability": None if daemon.durability is None else daemon.durability.as_dict(),
        "settled_waits": daemon.settled_waits,
        "paused": _paused(daemon),
        "last_request_at": stats["last_request_at"],
        "last_publish_at": stats["last_publish_at"],
        "stats": dict(stats),
    }


# At most this many workspaces are listed with their owned change sets on /status.
STATUS_MAX_WORKSPACES = 10


def top_workspaces(counts: Mapping[str, float], limit: int = STATUS_MAX_WORKSPACES) -> dict[str, float]:
    """The ``limit`` workspaces with the largest counts, largest first (/status and /metrics list no more)."""
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:limit])


# At most this many paused change sets and workspaces are listed on /status (all are counted).
STATUS_MAX_PAUSED = 100


def _paused(daemon: DaemonView) -> dict[str, Any]:
    pauses = daemon.pauses
    change_sets, workspaces = pauses.counts
    return {
        "change_sets": change_sets,
        "workspaces": workspaces,
        "pauses_by_cause": dict(pauses.pauses),
        "unreadable": pauses.unreadable,
        "held": [
            {
                "what": what,
                "cause": p.cause,
                "reason": p.reason,
                "since": p.since,
                "request_id": p.request_id,
                "repair": repair,  # set where the pause stands for damage (rebaser_core.pauses.repair_command)
            }
            for what, p, repair in pauses.listed()[:STATUS_MAX_PAUSED]
        ],
    }
