"""What each shard looks like in JetStream (leader, backlog, consumers), and spreading shard leaders over servers.

Shared by the daemon's ``/status`` (rebaser_server.ops.health) and ``rebaser streams show``.

One stream is served by its leader: all of its writes and the tasks consumer's deliveries go through one server. N
shards only add throughput if their leaders sit on different servers, and JetStream elects leaders without
regard to other streams, so :func:`spread_leaders` asks each shard's streams (and its tasks consumer) to step
down in favour of server ``k mod S`` (sorted by name): deterministic, so running it again changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rebaser_core.layout import Layout
from rebaser_core.subjects import LANE_CONSUMER, Subjects

__all__ = [
    "LanesAddedUp",
    "lanes_info",
    "shard_facts",
    "shard_report",
    "spread_leaders",
    "tasks_consumer_info",
]

log = logging.getLogger(__name__)

_STEPDOWN_TIMEOUT = 5.0


class LanesAddedUp:
    """A shard's lane consumers added up, read as its one tasks consumer would be (the lanes intake): tasks waiting
    for an owner, owned, redelivered, and daemon pulls waiting. There is no one delivered sequence (``None``)."""

    def __init__(self, infos: list[Any]) -> None:
        self.num_pending = sum(int(c.num_pending or 0) for c in infos)
        self.num_ack_pending = sum(int(c.num_ack_pending or 0) for c in infos)
        self.num_redelivered = sum(int(c.num_redelivered or 0) for c in infos)
        self.num_waiting = sum(int(c.num_waiting or 0) for c in infos)
        self.delivered = None


async def lanes_info(js: JetStreamContext, names: Subjects) -> LanesAddedUp:
    """The lane consumers of shard ``names``, added up (one listing, not a call per lane); NotFoundError if the
    shard has none."""
    infos = [
        c
        for c in await js.consumers_info(names.tasks_stream)
        if (c.name or "").startswith(f"{LANE_CONSUMER}-")
    ]
    if not infos:
        raise NotFoundError
    return LanesAddedUp(infos)


def tasks_consumer_info(
    js: JetStreamContext, names: Subjects, layout: Layout | None
) -> Awaitable[Any] | None:
    """The read of shard ``names``' tasks figures (waiting, owned, redelivered, pulls): its shared consumer's (fifo,
    or no layout), its lanes' added up, or None where no consumer counts them (the fair intake: one per workspace;
    or while the intake changes). A missing consumer raises NotFoundError when awaited."""
    if layout is None or layout.shared_consumer:
        return js.consumer_info(names.tasks_stream, names.tasks_consumer)
    return lanes_info(js, names) if layout.lane_consumers else None


def shard_facts(shard: int, requests: Any, consumer: Any, tasks: Any = None) -> dict[str, Any]:
    """One shard's line, from its requests stream info, tasks consumer info and (optionally) tasks stream info."""
    cluster = getattr(requests, "cluster", None) if requests is not None else None
    replicas = [cluster.leader] if cluster is not None and cluster.leader else []
    if cluster is not None:
        replicas += [p.name for p in cluster.replicas or [] if p.name]
    tasks_cluster = getattr(tasks, "cluster", None) if tasks is not None else None
    return {
        "shard": shard,
        "requests_waiting": None if requests is None else int(requests.state.messages),
        "requests_bytes": None if requests is None else int(requests.state.bytes),
        "consumers": None if requests is None else int(requests.state.consumer_count),
        "tasks_waiting": None if consumer is None else int(consumer.num_pending or 0),
        "tasks_unacked": None if consumer is None else int(consumer.num_ack_pending or 0),
        # Pull requests waiting on the tasks consumer: 0 means no daemon is pulling this shard right now.
        "pulling": None if consumer is None else int(consumer.num_waiting or 0),
        "leader": None if cluster is None else cluster.leader,
        "tasks_leader": None if tasks_cluster is None else tasks_cluster.leader,
        "servers": sorted(replicas),
    }


async def _nothing() -> None:
    return None


async def shard_report(
    js: JetStreamContext, subjects: Subjects, shards: range, layout: Layout | None = None
) -> list[dict[str, Any]]:
    """Every shard's facts; a shard whose stream or consumer is missing has ``None`` there (and ``error``). The
    consumer facts are :func:`tasks_consumer_info`'s for ``layout``, ``None`` where it has none."""

    async def one(shard: int) -> dict[str, Any]:
        names = subjects.for_shard(shard)
        calls = await asyncio.gather(
            js.stream_info(names.requests_stream),
            tasks_consumer_info(js, names, layout) or _nothing(),
            js.stream_info(names.tasks_stream),
            return_exceptions=True,
        )
        ok = [None if isinstance(c, BaseException) else c for c in calls]
        facts = shard_facts(shard, ok[0], ok[1], ok[2])
        errors = [f"{type(c).__name__}: {c}" for c in calls if isinstance(c, BaseException)]
        facts["error"] = "; ".join(errors) or None
        return facts

    return list(await asyncio.gather(*(one(k) for k in shards)))


async def _step_down(nc: NatsClient, api: str, preferred: str) -> str | None:
    """Ask a stream or consumer leader to hand over to ``preferred``; the error if refused."""
    body = json.dumps({"placement": {"preferred": preferred}}).encode()
    try:
        reply = await nc.request(api, body, timeout=_STEPDOWN_TIMEOUT)
    except (TimeoutError, nats.errors.Error) as err:
        return f"{type(err).__name__}: {err}"
    data = json.loads(reply.data or b"{}")
    return None if data.get("success") else str(data.get("error", data))


async def spread_leaders(
    nc: NatsClient, js: JetStreamContext, subjects: Subjects, shards: range
) -> list[str]:
    """Move shard ``k``'s leaders (requests, tasks, tasks consumer) to server ``k mod S``; what was done, as lines.

    A single server (no cluster) or a stream of one replica has nothing to move."""
    done: list[str] = []
    report = await shard_report(js, subjects, shards)
    servers = sorted({name for facts in report for name in facts["servers"]})
    if len(servers) < 2:
        return done
    for facts in report:
        shard = facts["shard"]
        preferred = servers[shard % len(servers)]
        if preferred not in facts["servers"]:
            continue  # this shard has no replica there (R1 streams, or placement tags)
        names = subjects.for_shard(shard)
        targets = (
            (
                names.requests_stream,
                facts["leader"],
                f"$JS.API.STREAM.LEADER.STEPDOWN.{names.requests_stream}",
            ),
            (
                names.tasks_stream,
                facts["tasks_leader"],
                f"$JS.API.STREAM.LEADER.STEPDOWN.{names.tasks_stream}",
            ),
        )
        for what, leader, api in targets:
            if leader == preferred:
                continue
            error = await _step_down(nc, api, preferred)
            done.append(f"{what}: leader {leader} -> {preferred}" + (f" refused: {error}" if error else ""))
        # The tasks consumer delivers the tasks: its leader should sit with its stream's.
        consumer_api = f"$JS.API.CONSUMER.LEADER.STEPDOWN.{names.tasks_stream}.{names.tasks_consumer}"
        try:
            info = await js.consumer_info(names.tasks_stream, names.tasks_consumer)
            leader = info.cluster.leader if info.cluster is not None else None
        except Exception:
            leader = preferred  # unknown: leave it
        if leader != preferred:
            error = await _step_down(nc, consumer_api, preferred)
            done.append(
                f"{names.tasks_stream}/{names.tasks_consumer}: leader {leader} -> {preferred}"
                + (f" refused: {error}" if error else "")
            )
    return done
