"""A workspace's tasks consumer (fair intake): made when the workspace is found with work (newcomers.py).

A work-queue stream accepts several consumers only if their filters do not overlap (nats-server's error 10100), so
the fifo intake's shared consumer, if one is left on a fair shard, is in the way of every workspace's.
"""

from __future__ import annotations

from nats.js.errors import BadRequestError

from rebaser_core.ids import WorkspacePk
from rebaser_core.nats.streams import (
    FILTER_OVERLAPS,
    remove_idle_shared_consumer,
    workspace_tasks_consumer_config,
)
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.changeset.context import Nats

__all__ = ["create_workspace_consumer"]


async def create_workspace_consumer(
    nats: Nats, settings: Settings, subjects: Subjects, workspace: WorkspacePk, streams: int
) -> None:
    """Make ``workspace``'s consumer on shard ``subjects.shard`` of ``streams`` (nats-server answers a create of one
    made already, the same, with it)."""
    config = workspace_tasks_consumer_config(settings, workspace, subjects.shard, streams)
    try:
        await nats.js.add_consumer(subjects.tasks_stream, config)
    except BadRequestError as err:
        if err.err_code != FILTER_OVERLAPS or not await remove_idle_shared_consumer(
            nats.js, subjects, "fair"
        ):
            raise
        await nats.js.add_consumer(subjects.tasks_stream, config)
