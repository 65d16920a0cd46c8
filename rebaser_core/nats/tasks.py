"""Publishing a change set's task: the one protocol rule both client and daemons follow.

The tasks stream keeps at most one message per change set (discard-new-per-subject). A publish that is
refused with err_code 10077 means "this change set already has a task", and that is success: whoever holds it
will see the request, because it was published first and the owner checks for queued requests after releasing.

:func:`check_pub_ack` also turns every other JetStream refusal into the typed error a caller can act on; for the
requests stream's limits that is :class:`~rebaser_core.errors.RebaserBusy` naming the limit.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from rebaser_core.errors import BusyLimit, InvalidSubject, RebaserBusy, RebaserRefused, RebaserUnavailable
from rebaser_core.nats.listing import stream_subjects
from rebaser_core.nats.pub_ack import read_pub_ack
from rebaser_core.nats.requester import Requester
from rebaser_core.subjects import Subjects

__all__ = [
    "CHANGE_SET_FULL_RETRY_AFTER",
    "STREAM_FULL_RETRY_AFTER",
    "TASK_EXISTS",
    "busy_error",
    "check_pub_ack",
    "ensure_connected",
    "parse_pub_ack",
    "publish_task",
    "store_tasks_as",
]

TASK_EXISTS = (
    10077  # "maximum messages per subject exceeded" on the tasks stream (and its other limits: see below)
)
# nats-server 2.15 reports every "stream full" limit (messages, bytes, per subject) as 10077; only the description
# tells them apart. 10054 is a message over the size limit, which retrying cannot fix (RebaserRefused).
STREAM_FULL = frozenset({10077})
_WORKSPACE = re.compile(r"workspace ([0-9A-Z]{26})")

# One change set's backlog drains as fast as its single owner applies requests (typically milliseconds each), so a
# short wait usually finds room. A full stream means the whole cluster is behind: back off for longer.
CHANGE_SET_FULL_RETRY_AFTER = 1.0
STREAM_FULL_RETRY_AFTER = 5.0

# Substrings of nats-server's descriptions, most specific first ("maximum messages per subject exceeded" also
# contains "maximum messages").
_LIMITS: tuple[tuple[str, BusyLimit, str, float], ...] = (
    (
        "per workspace",  # the daemons' request gate (rebaser_server.queries.gate), not nats-server
        "workspace_requests",
        "this workspace has as many requests queued as it may (workspace_max_requests); other workspaces still "
        "accept work",
        CHANGE_SET_FULL_RETRY_AFTER,
    ),
    (
        "per subject",
        "change_set",
        "this change set's backlog is full (requests_max_msgs_per_change_set); other change sets still accept work",
        CHANGE_SET_FULL_RETRY_AFTER,
    ),
    (
        "maximum bytes",
        "stream_bytes",
        "the requests stream is full (requests_max_bytes)",
        STREAM_FULL_RETRY_AFTER,
    ),
    (
        "maximum messages",
        "stream_messages",
        "the requests stream is full (requests_max_msgs)",
        STREAM_FULL_RETRY_AFTER,
    ),
)


# The tasks stream's own caps (tasks_max_msgs, tasks_max_bytes): every change set with work has a task, so a full
# tasks stream means the whole deployment is behind (or flooded with tasks).
_TASK_LIMITS: tuple[tuple[str, BusyLimit, str, float], ...] = (
    ("maximum bytes", "tasks_bytes", "the tasks stream is full (tasks_max_bytes)", STREAM_FULL_RETRY_AFTER),
    (
        "maximum messages",
        "tasks_messages",
        "the tasks stream is full (tasks_max_msgs)",
        STREAM_FULL_RETRY_AFTER,
    ),
)


def busy_error(
    subject: str,
    description: str,
    code: int,
    limits: tuple[tuple[str, BusyLimit, str, float], ...] = _LIMITS,
) -> RebaserBusy:
    """The :class:`RebaserBusy` for a 10077 refusal, naming the limit from nats-server's description (``limits``:
    the requests stream's, or the tasks stream's)."""
    lowered = description.lower()
    limit, what, retry_after = next(
        ((limit, what, retry) for needle, limit, what, retry in limits if needle in lowered),
        ("stream", "a stream limit was reached", STREAM_FULL_RETRY_AFTER),
    )
    workspace = _WORKSPACE.search(description) if limit == "workspace_requests" else None
    return RebaserBusy(
        f"publish to {subject} refused: {what}; retry after {retry_after:g}s "
        f"(nats-server: {description!r}, err_code {code})",
        retry_after=retry_after,
        limit=limit,
        workspace=workspace.group(1) if workspace else None,
    )


def check_pub_ack(data: bytes, subject: str, *, allow: tuple[int, ...] = ()) -> int | None:
    """The stream sequence of a JetStream publish ack; None for a refusal whose err_code is in ``allow``;
    a typed error for any other refusal."""
    reply = parse_pub_ack(data, subject, allow=allow)
    return None if "error" in reply else int(reply.get("seq", 0))


def parse_pub_ack(data: bytes, subject: str, *, allow: tuple[int, ...] = ()) -> dict[str, Any]:
    """A JetStream publish ack as a dict (a refusal whose err_code is in ``allow`` included); a typed error for any
    other refusal."""
    try:
        reply = read_pub_ack(data)
    except ValueError:
        raise RebaserUnavailable(f"publish to {subject}: unreadable JetStream reply {data[:80]!r}") from None
    if not isinstance(reply, dict):
        raise RebaserUnavailable(f"publish to {subject}: unreadable JetStream reply {data[:80]!r}")
    error = reply.get("error")
    if error is None:
        return reply
    code = int(error.get("err_code", 0))
    if code in allow:
        return reply
    description = str(error.get("description", ""))
    if code in STREAM_FULL:
        raise busy_error(subject, description, code)
    text = f"publish to {subject} refused: {description} (err_code {code})"
    if int(error.get("code", 0)) == 503:
        raise RebaserUnavailable(text)
    raise RebaserRefused(text)


def ensure_connected(nc: NatsClient, what: str) -> None:
    """Fail fast while the connection is down: nats-py would otherwise queue the publish in its reconnect buffer,
    where it may still go out long after the caller gave up (and was told it had not)."""
    if not nc.is_connected:
        state = "closed" if nc.is_closed else "reconnecting" if nc.is_reconnecting else "not connected"
        raise RebaserUnavailable(f"{what}: NATS connection is {state}")


async def publish_task(
    nc: NatsClient, subject: str, *, timeout: float = 5.0, requester: Requester | None = None
) -> bool:
    """Publish an empty task; True if created, False if the change set already had one. ``RebaserBusy`` if the
    tasks stream is full (``limit`` ``tasks_messages`` or ``tasks_bytes``)."""
    ensure_connected(nc, f"publish to {subject}")
    try:
        if requester is not None:
            msg = await requester.request(subject, b"", timeout=timeout)
        else:
            msg = await nc.request(subject, b"", timeout=timeout)
    except nats.errors.NoRespondersError:
        raise RebaserUnavailable(f"no JetStream stream answers on {subject}") from None
    except (TimeoutError, nats.errors.Error) as err:
        # TimeoutError covers nats.errors.TimeoutError; nats.errors.Error covers a connection that closed or whose
        # reconnect buffer is full (ConnectionClosedError, OutboundBufferLimitError).
        raise RebaserUnavailable(f"publish to {subject} failed: {err or type(err).__name__}") from None
    reply = parse_pub_ack(msg.data, subject, allow=(TASK_EXISTS,))
    error = reply.get("error")
    if error is None:
        return True
    description = str(error.get("description", ""))
    # 10077 is every discard-new limit; only the per-subject one says "this change set already has a task".
    if "per subject" in description.lower():
        return False
    raise busy_error(subject, description, TASK_EXISTS, _TASK_LIMITS)


async def store_tasks_as(nc: NatsClient, js: JetStreamContext, names: Subjects, lanes: int) -> int:
    """Make shard ``names.shard``'s tasks stream store tasks by lane (``lanes`` > 0: its subject transform) or not
    (0), and store again the new way every task stored the other way: published where tasks are published (refused
    as a duplicate if its change set has one stored the new way already), then deleted. How many moved.

    Only while nobody can hold a task stored the old way: its consumers are gone (a change of intake,
    rebaser_client.admin.intake, or a stream made before its layout said lanes)."""
    config = (await js.stream_info(names.tasks_stream)).config
    transform = None
    if lanes:
        source, destination = names.tasks_transform(lanes)
        transform = js_api.SubjectTransform(src=source, dest=destination)
    if config.subject_transform != transform:
        config.subject_transform = transform
        await js.update_stream(config)
    moved = 0
    for subject in await stream_subjects(js, names.tasks_stream, names.tasks_all):
        if names.is_lane_task(subject) == bool(lanes):
            continue
        try:
            parsed = names.parse_task(subject)
        except InvalidSubject:
            continue  # not a task: the orphan sweep's to remove
        try:
            old = await js.get_last_msg(names.tasks_stream, subject)
        except NotFoundError:
            continue
        task = names.task(parsed.workspace_id, parsed.change_set_id)
        try:
            await publish_task(nc, task)
        except RebaserBusy:
            # The tasks stream is full (a flood): the old one goes first to make room. Were this interrupted in
            # between, the change set's queued requests would get their task from the orphan sweep.
            with contextlib.suppress(NotFoundError):
                await js.delete_msg(names.tasks_stream, int(old.seq or 0))
            await publish_task(nc, task)
            moved += 1
            continue
        with contextlib.suppress(NotFoundError):
            await js.delete_msg(names.tasks_stream, int(old.seq or 0))
        moved += 1
    return moved
