"""A workspace's tasks consumer (fair intake): made when the workspace is found with work (newcomers.py).

A work-queue stream accepts several consumers only if their filters do not overlap (nats-server's error 10100), so
the fifo intake's shared consumer, if one is left on a fair shard, is in the way of every workspace's.
"""

from __future__ import annotations

import contextlib
import logging

from nats.js.errors import BadRequestError, NotFoundError

from rebaser_core.ids import WorkspacePk
from rebaser_core.nats.streams import workspace_tasks_consumer_config
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.changeset.context import Nats

__all__ = ["create_workspace_consumer"]

log = logging.getLogger(__name__)

# nats-server's "filtered consumer not unique on workqueue stream" (a filter overlapping another consumer's).
_FILTER_OVERLAPS = 10100


async def create_workspace_consumer(
    nats: Nats, settings: Settings, subjects: Subjects, workspace: WorkspacePk, streams: int
) -> None:
    """Make ``workspace``'s consumer on shard ``subjects.shard`` of ``streams`` (nats-server answers a create of one
    made already, the same, with it)."""
    config = workspace_tasks_consumer_config(settings, workspace, subjects.shard, streams)
    try:
        await nats.js.add_consumer(subjects.tasks_stream, config)
    except BadRequestError as err:
        if err.err_code != _FILTER_OVERLAPS or not await _remove_idle_shared_consumer(nats, subjects):
            raise
        await nats.js.add_consumer(subjects.tasks_stream, config)


async def _remove_idle_shared_consumer(nats: Nats, subjects: Subjects) -> bool:
    """The fifo intake's shared consumer on a fair shard (made by a script, or a daemon of an older version)
    overlaps every workspace's: removed if it holds no task (then nobody acts through it), else left alone (this
    workspace waits; ``rebaser streams intake fair`` removes it safely). Whether it was removed."""
    js, stream, name = nats.js, subjects.tasks_stream, subjects.tasks_consumer
    try:
        info = await js.consumer_info(stream, name)
    except NotFoundError:
        return False
    if info.num_ack_pending:
        log.error(
            "the fifo intake's consumer %s/%s holds %d tasks on a fair layout; the fair intake cannot make "
            "workspace consumers beside it (run 'rebaser streams intake fair' to remove it safely)",
            stream,
            name,
            info.num_ack_pending,
        )
        return False
    log.warning("removing the fifo intake's idle consumer %s/%s: the layout's intake is fair", stream, name)
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(stream, name)
    return True
