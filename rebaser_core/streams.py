"""Stream and consumer configurations (docs/design.md §1), derived from :class:`~rebaser_core.settings.Settings`.

``ensure_streams`` creates them or updates them in place; it is idempotent and safe to call from every daemon
at start-up.
"""

from __future__ import annotations

import contextlib

from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BadRequestError, NotFoundError

from rebaser_core.settings import Settings

__all__ = [
    "dead_letter_stream_config",
    "ensure_streams",
    "requests_stream_config",
    "tasks_consumer_config",
    "tasks_stream_config",
]

# Ordered consumers of change sets that are being released or taken over overlap for a moment; leave room.
_CONSUMER_HEADROOM = 64


def _storage(settings: Settings) -> js_api.StorageType:
    return js_api.StorageType.FILE if settings.storage == "file" else js_api.StorageType.MEMORY


def requests_stream_config(settings: Settings) -> js_api.StreamConfig:
    """``REBASER_REQUESTS``: limits retention; a processed request is deleted by sequence.

    Discard-new: a full stream refuses new requests rather than silently dropping old, acknowledged ones.
    Direct get is on so "is anything still queued for this change set?" is one cheap lookup.
    """
    per_subject = settings.requests_max_msgs_per_change_set
    return js_api.StreamConfig(
        name=settings.subjects.requests_stream,
        description="rebaser: queued change-set requests",
        subjects=[settings.subjects.requests_stream_subject],
        retention=js_api.RetentionPolicy.LIMITS,
        discard=js_api.DiscardPolicy.NEW,
        discard_new_per_subject=per_subject > 0,
        max_msgs_per_subject=per_subject,
        max_msgs=settings.requests_max_msgs,
        max_bytes=settings.requests_max_bytes,
        max_age=settings.requests_max_age,
        max_consumers=settings.max_active_change_sets + _CONSUMER_HEADROOM,
        storage=_storage(settings),
        num_replicas=settings.replicas,
        duplicate_window=settings.duplicate_window,
        allow_direct=True,
    )


def tasks_stream_config(settings: Settings) -> js_api.StreamConfig:
    """``REBASER_TASKS``: a work queue holding at most one task (one owner) per change set."""
    return js_api.StreamConfig(
        name=settings.subjects.tasks_stream,
        description="rebaser: one exclusive processing task per active change set",
        subjects=[settings.subjects.tasks_stream_subject],
        retention=js_api.RetentionPolicy.WORK_QUEUE,
        discard=js_api.DiscardPolicy.NEW,
        discard_new_per_subject=True,
        max_msgs_per_subject=1,
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
        max_age=settings.dead_letter_max_age,
        max_bytes=settings.dead_letter_max_bytes,
        max_msgs=settings.dead_letter_max_msgs,
        storage=_storage(settings),
        num_replicas=settings.replicas,
        duplicate_window=settings.duplicate_window,
        allow_direct=True,
    )


def tasks_consumer_config(settings: Settings) -> js_api.ConsumerConfig:
    """The one durable pull consumer shared by every daemon.

    ``max_deliver`` stays unlimited: a task is a lock, not a unit of work, and a task that hit max_deliver would
    stay in the work queue and block its change set (docs/design.md §3). Poison *requests* are bounded by
    ``Settings.max_attempts`` instead.
    """
    return js_api.ConsumerConfig(
        durable_name=settings.subjects.tasks_consumer,
        description="rebaser: tasks shared by all daemons",
        filter_subject=settings.subjects.tasks_filter,
        deliver_policy=js_api.DeliverPolicy.ALL,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        ack_wait=settings.ack_wait,
        max_deliver=-1,
        max_ack_pending=settings.max_active_change_sets,
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


async def ensure_streams(js: JetStreamContext, settings: Settings, *, consumer: bool = True) -> None:
    """Create or update the three streams and (with ``consumer``) the shared tasks consumer."""
    for config in (
        requests_stream_config(settings),
        tasks_stream_config(settings),
        dead_letter_stream_config(settings),
    ):
        await _ensure_stream(js, config)
    if consumer:
        # add_consumer on a durable is create-or-update on the server.
        await js.add_consumer(settings.subjects.tasks_stream, tasks_consumer_config(settings))
