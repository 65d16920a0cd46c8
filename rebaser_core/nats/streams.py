"""Stream and consumer configurations (docs/design.md §1), derived from :class:`~rebaser_core.settings.Settings`.

``ensure_streams`` creates them or updates them in place; it is idempotent and safe to call from every daemon
at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import nats.errors
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from rebaser_core.batches import PART_BYTES
from rebaser_core.ids import WorkspacePk
from rebaser_core.layout import Layout
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects

__all__ = [
    "AUDIT_MAX_AGE",
    "AUDIT_MAX_MSGS",
    "FILTER_OVERLAPS",
    "audit_stream_config",
    "dead_letter_stream_config",
    "ensure_layout_streams",
    "ensure_shard",
    "ensure_streams",
    "events_stream_config",
    "lane_tasks_consumer_config",
    "open_bucket",
    "open_object_store",
    "remove_idle_shared_consumer",
    "requests_stream_config",
    "split",
    "stored_batches_stream_config",
    "tasks_consumer_config",
    "tasks_stream_config",
    "workspace_tasks_consumer_config",
]

log = logging.getLogger(__name__)

# Ordered consumers of change sets that are being released or taken over overlap for a moment; leave room.
_CONSUMER_HEADROOM = 64
# Fair intake: the tasks stream holds one consumer per workspace with tasks (and for WORKSPACE_CONSUMER_IDLE after).
_MAX_WORKSPACE_CONSUMERS = 100_000
# Fair intake: a workspace's consumer outlives its last pull by this long, so a workspace that comes back within it
# pays no consumer creation (a few ms on nats-server with thousands of consumers, docs/capacity.md).
WORKSPACE_CONSUMER_IDLE = 600.0


def _storage(settings: Settings) -> js_api.StorageType:
    return js_api.StorageType.FILE if settings.storage == "file" else js_api.StorageType.MEMORY


async def open_object_store(js: JetStreamContext, name: str, settings: Settings) -> ObjectStore:
    """The object store ``name``, created (with the deployment's storage and replicas) if it does not exist."""
    try:
        return await js.object_store(name)
    except BucketNotFoundError:
        return await js.create_object_store(
            name,
            js_api.ObjectStoreConfig(bucket=name, storage=_storage(settings), replicas=settings.replicas),
        )


async def open_bucket(
    js: JetStreamContext, config: js_api.KeyValueConfig, *, create: bool
) -> KeyValue | None:
    """The KV bucket ``config`` names; created with ``config`` if it does not exist and ``create`` (else None)."""
    assert config.bucket is not None
    try:
        return await js.key_value(config.bucket)
    except BucketNotFoundError:
        if not create:
            return None
    with contextlib.suppress(nats.errors.Error):  # created concurrently by another daemon: open it below
        return await js.create_key_value(config)
    return await js.key_value(config.bucket)


def split(total: int, streams: int) -> int:
    """One shard's part of a cluster-wide cap (-1: unlimited stays unlimited). Rounded down, so the shards
    together never exceed the cap; at least 1, so no shard is closed. Hash spreads change sets unevenly, so a shard
    can reach its part before the cluster reaches the total: its work then waits (a task stays queued) or is
    refused with RebaserBusy, never lost."""
    if total < 0 or streams <= 1:
        return total
    return max(1, total // streams)


def requests_stream_config(settings: Settings, shard: int = 0, streams: int = 1) -> js_api.StreamConfig:
    """``REBASER_REQUESTS``: limits retention; a processed request is deleted by sequence.

    Discard-new: a full stream refuses new requests rather than silently dropping old, acknowledged ones.
    Direct get is on so "is anything still queued for this change set?" is one cheap lookup.
    """
    per_subject = settings.requests_max_msgs_per_change_set
    subjects = settings.subjects.for_shard(shard)
    return js_api.StreamConfig(
        name=subjects.requests_stream,
        description=f"rebaser: queued change-set requests (shard {shard} of {streams})",
        subjects=[subjects.requests_stream_subject],
        retention=js_api.RetentionPolicy.LIMITS,
        discard=js_api.DiscardPolicy.NEW,
        discard_new_per_subject=per_subject > 0,
        max_msgs_per_subject=per_subject,
        max_msgs=split(settings.requests_max_msgs, streams),
        max_bytes=split(settings.requests_max_bytes, streams),
        max_age=settings.requests_max_age,
        # Set explicitly: nats-server caps a stream at 1,000 consumers otherwise.
        max_consumers=split(settings.max_active_change_sets, streams) + _CONSUMER_HEADROOM,
        storage=_storage(settings),
        num_replicas=settings.replicas,
        duplicate_window=settings.duplicate_window,
        allow_direct=True,
    )


def tasks_stream_config(
    settings: Settings, shard: int = 0, streams: int = 1, lanes: int = 0
) -> js_api.StreamConfig:
    """``REBASER_TASKS``: a work queue holding at most one task (one owner) per change set.

    With ``lanes`` (the lanes intake) the stream stores each task under its workspace's lane
    (``….<wk>.<cs>.<lane>``, Subjects.tasks_transform): one consumer per lane reads them. Without, the transform is
    removed (a change of intake moves the stored tasks: rebaser_client.admin.intake).

    ``max_consumers`` is set for the fair intake's consumer per workspace (nats-server caps a stream at 1,000
    otherwise); the fifo intake uses one. Discard-new: once ``tasks_max_msgs`` (or bytes) is reached a new task is
    refused (``RebaserBusy``), never an old one dropped."""
    subjects = settings.subjects.for_shard(shard)
    transform = None
    if lanes:
        source, destination = subjects.tasks_transform(lanes)
        transform = js_api.SubjectTransform(src=source, dest=destination)
    return js_api.StreamConfig(
        name=subjects.tasks_stream,
        subject_transform=transform,
        description=f"rebaser: one exclusive processing task per active change set (shard {shard} of {streams})",
        subjects=[subjects.tasks_stream_subject],
        retention=js_api.RetentionPolicy.WORK_QUEUE,
        discard=js_api.DiscardPolicy.NEW,
        discard_new_per_subject=True,
        max_msgs_per_subject=1,
        max_msgs=split(settings.tasks_max_msgs, streams),
        max_bytes=split(settings.tasks_max_bytes, streams),
        max_consumers=_MAX_WORKSPACE_CONSUMERS,
        storage=_storage(settings),
        num_replicas=settings.replicas,
        duplicate_window=settings.duplicate_window,
        allow_direct=True,
    )


def dead_letter_stream_config(settings: Settings) -> js_api.StreamConfig:
    """Dead letters: unprocessable requests with the reason, kept for inspection and replay."""
    return js_api.StreamConfig(
        name=settings.subjects.dead_letter_stream,
        description="rebaser: requests that could not be processed, with the reason",
        subjects=[settings.subjects.dead_letters_all],
        retention=js_api.RetentionPolicy.LIMITS,
        discard=js_api.DiscardPolicy.OLD,  # bounded: a flood of poison drops the oldest dead letters, not work
        # A subject is one change set's (or the malformed ones'): its flood drops its own oldest letters first. The
        # workspace's share is kept by the daemon (rebaser_server.changeset.replies); the caps below are the last
        # resort (docs/capacity.md#bounds).
        max_msgs_per_subject=settings.dead_letter_max_per_change_set,
        max_age=settings.dead_letter_max_age,
        max_bytes=settings.dead_letter_max_bytes,
        max_msgs=settings.dead_letter_max_msgs,
        storage=_storage(settings),
        num_replicas=settings.replicas,
        duplicate_window=settings.duplicate_window,
        allow_direct=True,
    )


AUDIT_MAX_AGE = 90 * 24 * 3600.0  # seconds an audit entry is kept
AUDIT_MAX_MSGS = 100_000  # audit entries kept at most (the oldest go first)
# No byte cap: nats-server reserves a stream's max_bytes up front against its store (each test deployment, or a
# deployment with memory storage, would give up 256 MiB for a trail of kilobytes). Count and entry size bound it:
# 100,000 entries of at most 8 KiB, a few hundred bytes each in practice.
AUDIT_MAX_MSG = 8 * 1024


def audit_stream_config(
    subjects: Subjects, *, storage: js_api.StorageType = js_api.StorageType.FILE, replicas: int = 1
) -> js_api.StreamConfig:
    """``REBASER_AUDIT``: the operators' actions from the console and the ``rebaser`` commands (written by them:
    rebaser_client.admin.audit), the newest kept: bounded by age, count and entry size, the oldest go first. The daemons
    create it (an operator's NATS user may not create streams); a writer that finds none creates it the same way."""
    return js_api.StreamConfig(
        name=subjects.audit_stream,
        description="rebaser: operators' actions from the console and the rebaser commands (newest kept)",
        subjects=[subjects.audit_all],
        retention=js_api.RetentionPolicy.LIMITS,
        discard=js_api.DiscardPolicy.OLD,
        max_age=AUDIT_MAX_AGE,
        max_msgs=AUDIT_MAX_MSGS,
        max_msg_size=AUDIT_MAX_MSG,
        storage=storage,
        num_replicas=replicas,
        allow_direct=True,
    )


def events_stream_config(settings: Settings) -> js_api.StreamConfig:
    """``REBASER_EVENTS``: every change set's event feed, bounded per change set and by age; the oldest go first.

    One stream for every shard (a change set's feed stays put when the layout changes). Events are small (under
    4 KiB) and published off the request path."""
    return js_api.StreamConfig(
        name=settings.subjects.events_stream,
        description="rebaser: what happens to each change set, for followers (docs/events.md)",
        subjects=[settings.subjects.events_stream_subject],
        retention=js_api.RetentionPolicy.LIMITS,
        discard=js_api.DiscardPolicy.OLD,
        max_msgs_per_subject=settings.events_max_per_change_set,
        max_age=settings.events_max_age,
        max_msg_size=8 * 1024,
        storage=_storage(settings),
        num_replicas=settings.replicas,
        duplicate_window=settings.duplicate_window,
        allow_direct=True,
        # One change set's events go out as atomic batches, stored in order (rebaser_server.changeset.event_pump).
        allow_atomic=True,
    )


def stored_batches_stream_config(settings: Settings) -> js_api.StreamConfig:
    """``REBASER_STORED_BATCHES``: the stored update batches, each under its workspace (rebaser_core.batches).

    One message per subject (a part, or the manifest): a batch written again replaces itself. Bounded in age
    (``stored_batches_max_age``) and in total (``stored_batches_max_msgs``, ``stored_batches_max_bytes``), discard
    new: a full stream refuses a new batch rather than drop one a queued request names. One workspace's share
    (``stored_batches_max_msgs_per_workspace``) and unfinished batches are kept in bounds by the daemons' batch
    sweep (rebaser_server.daemon.batch_sweep)."""
    return js_api.StreamConfig(
        name=settings.subjects.stored_batches_stream,
        description="rebaser: stored update batches, by workspace and content address (docs/protocol.md §14)",
        subjects=[settings.subjects.stored_batches_subject],
        retention=js_api.RetentionPolicy.LIMITS,
        discard=js_api.DiscardPolicy.NEW,
        max_msgs_per_subject=1,
        max_msgs=settings.stored_batches_max_msgs,
        max_bytes=settings.stored_batches_max_bytes,
        max_age=settings.stored_batches_max_age,
        max_msg_size=PART_BYTES + 1024,
        storage=_storage(settings),
        num_replicas=settings.replicas,
        duplicate_window=settings.duplicate_window,
        allow_direct=True,
    )


def tasks_consumer_config(settings: Settings, shard: int = 0, streams: int = 1) -> js_api.ConsumerConfig:
    """The one durable pull consumer shared by every daemon.

    ``max_deliver`` stays unlimited: a task is a lock, not a unit of work, and a task that hit max_deliver would
    stay in the work queue and block its change set (docs/design.md §3). Poison *requests* are bounded by
    ``Settings.max_attempts`` instead. With shards, each shard's consumer gets its part of the cluster-wide cap on
    active change sets.
    """
    subjects = settings.subjects.for_shard(shard)
    return js_api.ConsumerConfig(
        durable_name=subjects.tasks_consumer,
        description="rebaser: tasks shared by all daemons",
        filter_subject=subjects.tasks_filter,
        deliver_policy=js_api.DeliverPolicy.ALL,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        ack_wait=settings.consumer_ack_wait,
        max_deliver=-1,
        max_ack_pending=split(settings.max_active_change_sets, streams),
        num_replicas=settings.replicas,
    )


def workspace_tasks_consumer_config(
    settings: Settings, workspace_id: WorkspacePk, shard: int = 0, streams: int = 1
) -> js_api.ConsumerConfig:
    """Fair intake: the durable pull consumer of one workspace's tasks in one shard, shared by every daemon.

    The same as the shared consumer (a task is a lock: explicit ack, ``max_deliver`` unlimited, the lease's
    ``ack_wait``) but filtered to the workspace, so its tasks wait in a queue of their own. Made when the workspace
    first has a task to take, deleted by nats-server :data:`WORKSPACE_CONSUMER_IDLE` after its last pull (daemons
    pull it while any of its tasks is held: rebaser_server.intake.fair_intake)."""
    subjects = settings.subjects.for_shard(shard)
    return js_api.ConsumerConfig(
        durable_name=subjects.workspace_tasks_consumer(workspace_id),
        description="rebaser: one workspace's tasks, shared by all daemons",
        filter_subject=subjects.tasks_of_workspace(workspace_id),
        deliver_policy=js_api.DeliverPolicy.ALL,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        ack_wait=settings.consumer_ack_wait,
        max_deliver=-1,
        max_ack_pending=split(settings.max_active_change_sets, streams),
        inactive_threshold=WORKSPACE_CONSUMER_IDLE,
        num_replicas=settings.replicas,
    )


def lane_tasks_consumer_config(
    settings: Settings, lane: int, shard: int = 0, streams: int = 1
) -> js_api.ConsumerConfig:
    """Lanes intake: the durable pull consumer of one lane's tasks in one shard, shared by every daemon.

    The same as the shared consumer (a task is a lock: explicit ack, ``max_deliver`` unlimited, the lease's
    ``ack_wait``) but filtered to the tasks stored under the lane. ``max_ack_pending`` counts the tasks a daemon
    handed back for later (a workspace past its share: rebaser_server.intake.lane_intake) besides those held, so it
    is the shard's whole cap: a lane may hold a lone workspace's every change set."""
    subjects = settings.subjects.for_shard(shard)
    return js_api.ConsumerConfig(
        durable_name=subjects.lane_consumer(lane),
        description="rebaser: one lane's tasks, shared by all daemons",
        filter_subject=subjects.lane_tasks(lane),
        deliver_policy=js_api.DeliverPolicy.ALL,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        ack_wait=settings.consumer_ack_wait,
        max_deliver=-1,
        max_ack_pending=split(settings.max_active_change_sets, streams),
        num_replicas=settings.replicas,
    )


async def _ensure_stream(js: JetStreamContext, config: js_api.StreamConfig) -> None:
    assert config.name is not None
    try:
        await js.stream_info(config.name)
    except NotFoundError:
        with contextlib.suppress(BadRequestError):  # created concurrently by another daemon
            await js.add_stream(config)
            return
    await js.update_stream(config)


async def ensure_shard(
    js: JetStreamContext,
    settings: Settings,
    shard: int,
    streams: int,
    *,
    consumer: bool = True,
    lanes: int = 0,
    lane_consumers: bool = False,
) -> None:
    """Create or update one shard's requests and tasks streams (``lanes``: stored by lane) and (with ``consumer``:
    the fifo intake) its tasks consumer, or (``lane_consumers``: the lanes intake) its lanes' consumers."""
    await _ensure_stream(js, requests_stream_config(settings, shard, streams))
    await _ensure_stream(js, tasks_stream_config(settings, shard, streams, lanes))
    subjects: Subjects = settings.subjects.for_shard(shard)
    if consumer:
        # add_consumer on a durable is create-or-update on the server.
        await js.add_consumer(subjects.tasks_stream, tasks_consumer_config(settings, shard, streams))
    if lane_consumers and lanes:
        configs = [lane_tasks_consumer_config(settings, lane, shard, streams) for lane in range(lanes)]
        try:
            await asyncio.gather(*(js.add_consumer(subjects.tasks_stream, config) for config in configs))
        except BadRequestError as err:
            if err.err_code != FILTER_OVERLAPS or not await remove_idle_shared_consumer(
                js, subjects, "lanes"
            ):
                raise
            await asyncio.gather(*(js.add_consumer(subjects.tasks_stream, config) for config in configs))


# nats-server's "filtered consumer not unique on workqueue stream" (a filter overlapping another consumer's).
FILTER_OVERLAPS = 10100


async def remove_idle_shared_consumer(js: JetStreamContext, subjects: Subjects, intake: str) -> bool:
    """The fifo intake's shared consumer on a shard of another ``intake`` (made by a script, or a daemon of an older
    version) overlaps every consumer of that intake: removed if it holds no task (then nobody acts through it), else
    left alone (the other intake waits; ``rebaser streams intake <intake>`` removes it safely). Whether it was
    removed."""
    stream, name = subjects.tasks_stream, subjects.tasks_consumer
    try:
        info = await js.consumer_info(stream, name)
    except NotFoundError:
        return False
    if info.num_ack_pending:
        log.error(
            "the fifo intake's consumer %s/%s holds %d tasks on a %s layout; that intake's consumers cannot be made "
            "beside it (run 'rebaser streams intake %s' to remove it safely)",
            stream,
            name,
            info.num_ack_pending,
            intake,
            intake,
        )
        return False
    log.warning(
        "removing the fifo intake's idle consumer %s/%s: the layout's intake is %s", stream, name, intake
    )
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(stream, name)
    return True


async def ensure_layout_streams(js: JetStreamContext, settings: Settings, layout: Layout) -> None:
    """:func:`ensure_streams` for every shard of ``layout``, with its intake's consumers and tasks transform."""
    await ensure_streams(
        js,
        settings,
        shards=layout.shards,
        streams=layout.streams,
        consumer=layout.shared_consumer,
        lanes=layout.lanes,
        lane_consumers=layout.lane_consumers,
    )


async def ensure_streams(
    js: JetStreamContext,
    settings: Settings,
    *,
    consumer: bool = True,
    shards: range = range(1),
    streams: int = 1,
    lanes: int = 0,
    lane_consumers: bool = False,
) -> None:
    """Create or update the dead-letter, stored-batches, audit (and events) streams and every shard in ``shards``
    (of ``streams`` current shards; shards beyond it are draining and keep the split of their own layout, which is
    the same or smaller)."""
    for shard in shards:
        await ensure_shard(
            js,
            settings,
            shard,
            max(streams, 1),
            consumer=consumer,
            lanes=lanes,
            lane_consumers=lane_consumers,
        )
    await _ensure_stream(js, dead_letter_stream_config(settings))
    await _ensure_stream(js, stored_batches_stream_config(settings))
    await _ensure_stream(
        js, audit_stream_config(settings.subjects, storage=_storage(settings), replicas=settings.replicas)
    )
    if settings.events:
        await _ensure_stream(js, events_stream_config(settings))
