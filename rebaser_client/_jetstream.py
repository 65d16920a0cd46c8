"""The JetStream calls behind the operations the library offers operators (pausing in :mod:`rebaser_client._pausing`,
skipping in :mod:`rebaser_client._skipping`), which ``rebaser_client.admin`` reuses for its reports.

One deadline for every call (:data:`OPERATOR_TIMEOUT`), one line for a call that failed (:func:`js_error`), where a
change set's requests are now (its shards, from the layout) and whether a daemon holds its task (:func:`task_state`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rebaser_client._routing import fetch_layout
from rebaser_core.errors import InvalidSubject, RebaserError, RebaserRefused, RebaserUnavailable
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.layout import Layout
from rebaser_core.subjects import Subjects

__all__ = [
    "OPERATOR_TIMEOUT",
    "TaskState",
    "consumer_upto",
    "delivered_upto",
    "jetstream",
    "js_error",
    "parse_ids",
    "read_layout",
    "shard_now",
    "shards_of",
    "task_seq_and_lane",
    "task_state",
    "task_state_upto",
]

# Every JetStream call of an operator's operation answers within this long, or the operation says NATS did not
# answer: an operator waits for one line, not for a library's default budget.
OPERATOR_TIMEOUT = 5.0

TaskState = Literal["owned", "waiting", "none"]
"""``owned``: the change set's task is delivered to a daemon; ``waiting``: for an owner; ``none``: it has none."""


def jetstream(nc: NatsClient) -> JetStreamContext:
    return nc.jetstream(timeout=OPERATOR_TIMEOUT)


def js_error(err: BaseException, subjects: Subjects) -> RebaserError:
    """The one line for a JetStream call that failed."""
    if isinstance(err, nats.errors.NoRespondersError | NotFoundError):
        # Direct gets of a stream that does not exist have no responders.
        return RebaserRefused(
            f"no rebaser deployment with prefix {subjects.prefix or '(none)'} here: its streams do not exist "
            "(is --prefix / REBASER_PREFIX right? has a daemon started?)"
        )
    return RebaserUnavailable(f"JetStream did not answer: {err or type(err).__name__}")


def parse_ids(subject: str, parse: Callable[[str], Any]) -> tuple[str, str] | None:
    """(workspace, change set) of a request, task or dead-letter subject; None for one ``parse`` refuses."""
    try:
        parsed = parse(subject)
    except InvalidSubject:
        return None
    return str(parsed.workspace_id), str(parsed.change_set_id)


# -- where a change set is -------------------------------------------------------------------------------------------
async def read_layout(nc: NatsClient, subjects: Subjects) -> Layout | None:
    try:
        return await fetch_layout(nc, subjects)
    except (TimeoutError, nats.errors.Error) as err:
        raise RebaserUnavailable(f"reading the shard layout failed: {err or type(err).__name__}") from None


def shard_now(subjects: Subjects, layout: Layout | None, wk: WorkspacePk, cs: ChangeSetId) -> Subjects:
    """The names of the change set's shard now (its task's)."""
    return subjects if layout is None else subjects.for_shard(layout.shard_of(wk, cs))


def shards_of(subjects: Subjects, layout: Layout | None, wk: WorkspacePk, cs: ChangeSetId) -> list[Subjects]:
    """The change set's shards, in the order its requests are applied: while the layout changes its old shard
    first, then its current one."""
    if layout is None:
        return [subjects]
    current = layout.shard_of(wk, cs)
    old = layout.old_shard_of(wk, cs)
    return [subjects.for_shard(s) for s in ([current] if old is None else [old, current])]


# -- who holds it ----------------------------------------------------------------------------------------------------
async def delivered_upto(js: JetStreamContext, subjects: Subjects, consumer: str | None = None) -> int | None:
    """A tasks consumer's last delivered stream sequence (the shared one unless ``consumer`` is named): a task at
    or below it is held by a daemon. None if there is no such consumer."""
    try:
        info = await js.consumer_info(subjects.tasks_stream, consumer or subjects.tasks_consumer)
    except NotFoundError:
        return None
    return int(info.delivered.stream_seq or 0) if info.delivered else 0


async def consumer_upto(
    js: JetStreamContext, subjects: Subjects, workspace_id: WorkspacePk, *, lane: int | None
) -> int | None:
    """The last delivered sequence of the consumer that hands out ``workspace_id``'s tasks when there is no shared
    one: its own (the fair intake) or its lane's (the lanes intake: ``lane``, the tail its task is stored under).
    None if neither exists."""
    upto = await delivered_upto(js, subjects, subjects.workspace_tasks_consumer(workspace_id))
    if upto is None and lane is not None:
        upto = await delivered_upto(js, subjects, subjects.lane_consumer(lane))
    return upto


async def task_state_upto(
    js: JetStreamContext,
    subjects: Subjects,
    workspace_id: WorkspacePk,
    change_set_id: ChangeSetId,
    upto: int | None,
) -> TaskState:
    """The change set's task state, given ``upto``: the shared tasks consumer's last delivered sequence (None: there
    is none, the fair intake: the workspace's own consumer is asked)."""
    stored = await task_seq_and_lane(js, subjects, workspace_id, change_set_id)
    if stored is None:
        return "none"
    seq, lane = stored
    if upto is None:
        upto = await consumer_upto(js, subjects, workspace_id, lane=lane)
    return "owned" if upto is not None and seq <= upto else "waiting"


async def task_seq_and_lane(
    js: JetStreamContext, subjects: Subjects, workspace_id: WorkspacePk, change_set_id: ChangeSetId
) -> tuple[int, int | None] | None:
    """The stream sequence of the change set's task in its shard's tasks stream, and the lane it is stored under
    (None: not stored by lane); None if it has no task. A task keeps its sequence while it lives (a hand-back
    redelivers the same message), so a reader that follows many change sets (the web console) reads it once per
    task and compares it with the consumer's delivered sequence."""
    try:
        msg = await js.get_last_msg(
            subjects.tasks_stream, subjects.stored_task(workspace_id, change_set_id), direct=True
        )
    except NotFoundError:
        return None
    tail = (msg.subject or "").rsplit(".", 1)[-1]
    return int(msg.seq or 0), int(tail) if tail.isdigit() else None


async def task_state(
    nc: NatsClient, subjects: Subjects, workspace_id: WorkspacePk, change_set_id: ChangeSetId
) -> TaskState:
    """``owned`` (its task is delivered to a daemon), ``waiting`` (for an owner) or ``none``."""
    js = jetstream(nc)
    try:
        return await task_state_upto(
            js, subjects, workspace_id, change_set_id, await delivered_upto(js, subjects)
        )
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
