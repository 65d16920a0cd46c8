"""Changing the number of shards online (``rebaser streams set N``), and reading the layout for ``show``.

A change runs in three steps, each safe to interrupt and to run again:

1. **Open**: create the new shards' streams (copies of shard 0's configuration), then write the layout with the
   new N and the old one as ``previous`` (compare-and-set: two admins cannot interleave). Clients route new requests
   by the new N within a second; daemons serve the old and the new shards.
2. **Drain**: wait until no change set has a request or a task left in a shard that is no longer its own. Meanwhile
   every daemon applies the old shard's requests of a change set before its new shard's
   (rebaser_server.changeset.migration).
3. **Settle**: write the layout without ``previous``; delete the streams of removed shards once they are empty;
   spread the shards' leaders over the servers.

Refused: a change while another is still draining (run ``set`` with that N again to resume it), pinned mode with more
daemons than the new N, and anything without a layout (no daemon ever started on the deployment).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from rebaser_core.errors import InvalidSubject, LayoutMismatch
from rebaser_core.layout import LANES, AssignmentMode, Layout
from rebaser_core.nats.layout_store import DEFAULT_POLL, open_layout, read_layout, write_layout
from rebaser_core.nats.listing import stream_subjects
from rebaser_core.nats.shard_info import shard_report, spread_leaders
from rebaser_core.nats.streams import split
from rebaser_core.subjects import Subjects

__all__ = ["change_streams", "current_layout", "misplaced", "show_layout"]

_JS_TIMEOUT = 5.0
_DRAIN_POLL = 0.5
# Settle no sooner than this after opening: every client and daemon has read the new layout by then.
_SETTLE_AFTER = 3 * DEFAULT_POLL


async def current_layout(js: JetStreamContext, subjects: Subjects) -> tuple[Layout, int]:
    kv = await open_layout(js, subjects)
    found = None if kv is None else await read_layout(kv, subjects)
    if found is None:
        raise LayoutMismatch(
            "this deployment has no shard layout yet: start a daemon first (it writes the layout from its "
            "--streams, default 1)"
        )
    return found


async def show_layout(nc: NatsClient, subjects: Subjects) -> dict[str, Any]:
    js = nc.jetstream(timeout=_JS_TIMEOUT)
    layout, revision = await current_layout(js, subjects)
    return {
        "streams": layout.streams,
        "mode": layout.mode,
        "previous": layout.previous,
        "epoch": layout.epoch,
        "intake": layout.intake,
        "intake_from": layout.intake_from,
        "revision": revision,
        "shards": await shard_report(js, subjects, layout.shards, layout),
    }


async def misplaced(js: JetStreamContext, subjects: Subjects, layout: Layout) -> int:
    """Change sets with requests or a task in a shard that is not (or no longer) theirs."""
    count = 0
    for shard in layout.shards:
        names = subjects.for_shard(shard)
        for stream, everything, parse in (
            (names.requests_stream, names.requests_all, names.parse_requests),
            (names.tasks_stream, names.tasks_all, names.parse_task),
        ):
            try:
                listed = await stream_subjects(js, stream, everything)
            except NotFoundError:
                continue
            for subject in listed:
                try:
                    parsed = parse(subject)
                except InvalidSubject:
                    continue  # junk: the orphan sweep removes it
                if layout.shard_of(parsed.workspace_id, parsed.change_set_id) != shard:
                    count += 1
    return count


async def _clone_shards(
    js: JetStreamContext, subjects: Subjects, old: int, new: int, *, intake: str = "fifo", lanes: int = LANES
) -> None:
    """Create shards old..new-1 as copies of shard 0 (the daemons re-ensure them with their own settings). The fair
    intake's consumers (one per workspace) are made by the daemons as workspaces have tasks, the lanes intake's as they
    follow the new layout: none is copied."""
    zero = subjects.for_shard(0)
    requests = (await js.stream_info(zero.requests_stream)).config
    tasks = (await js.stream_info(zero.tasks_stream)).config
    consumer = (
        (await js.consumer_info(zero.tasks_stream, zero.tasks_consumer)).config if intake == "fifo" else None
    )
    total = (
        (consumer.max_ack_pending if consumer else None) or 1
    ) * old  # shard 0's part of the cluster-wide cap
    for shard in range(old, new):
        names = subjects.for_shard(shard)
        for config, name, subject in (
            (requests, names.requests_stream, names.requests_stream_subject),
            (tasks, names.tasks_stream, names.tasks_stream_subject),
        ):
            if config.subject_transform is not None:  # the lanes intake's, of this shard's subjects
                source, destination = names.tasks_transform(lanes)
                config = dataclasses.replace(
                    config, subject_transform=js_api.SubjectTransform(src=source, dest=destination)
                )
            try:
                await js.stream_info(name)
            except NotFoundError:
                await js.add_stream(dataclasses.replace(config, name=name, subjects=[subject]))
        if consumer is None:
            continue
        await js.add_consumer(
            names.tasks_stream,
            dataclasses.replace(
                consumer, filter_subject=names.tasks_filter, max_ack_pending=split(total, new)
            ),
        )


async def change_streams(
    nc: NatsClient,
    subjects: Subjects,
    streams: int,
    *,
    daemons: int | None = None,
    mode: AssignmentMode | None = None,
    timeout: float = 600.0,
    progress: Callable[[str], None] = lambda _line: None,
) -> Layout:
    """Change the layout to ``streams`` shards and wait (up to ``timeout``) until it settled; see the module doc.

    Raises LayoutMismatch if refused, TimeoutError if the old shards did not drain in time (the layout then stays
    migrating: run it again to keep waiting)."""
    js = nc.jetstream(timeout=_JS_TIMEOUT)
    layout, revision = await current_layout(js, subjects)
    if layout.migrating and layout.streams != streams:
        raise LayoutMismatch(
            f"the change to {layout.streams} streams is still draining the previous {layout.previous}; finish "
            f"it first ('rebaser streams set {layout.streams}' resumes waiting)"
        )
    if mode is not None and mode != layout.mode:
        # The assignment mode moves no data: daemons re-assign their pullers when they read the new layout.
        if mode == "pinned" and (daemons is None or daemons > streams):
            raise LayoutMismatch(
                "pinned needs --daemons R with R <= N (and every daemon its --daemons and index)"
            )
        layout = dataclasses.replace(layout, mode=mode, epoch=layout.epoch + 1)
        revision = await write_layout(await _kv(js, subjects), subjects, layout, revision=revision)
        progress(f"assignment mode: {mode}")
    if layout.mode == "pinned":
        if daemons is None:
            raise LayoutMismatch("the layout is pinned: say how many daemons run with --daemons R (R <= N)")
        if daemons > streams:
            raise LayoutMismatch(
                f"pinned with {daemons} daemons: {streams} streams would leave a daemon idle"
            )
    if not layout.migrating:
        if layout.streams == streams:
            progress(f"already {streams} streams; nothing to do")
            return layout
        await _clone_shards(
            js, subjects, layout.streams, streams, intake=layout.intake, lanes=layout.lane_count
        )
        layout = layout.changed_to(streams)
        revision = await write_layout(await _kv(js, subjects), subjects, layout, revision=revision)
        progress(f"layout: {layout.previous} -> {streams} streams; new requests go to the new shards")
    opened = time.monotonic()
    deadline = opened + timeout
    while True:
        left = await misplaced(js, subjects, layout)
        if left == 0 and time.monotonic() - opened >= _SETTLE_AFTER:
            if await _retire_removed(js, subjects, streams, layout.shards, progress):
                break
            left = 1  # a stale client's request landed in a removed shard meanwhile: drain it too
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"{left} change sets still have work in shards that are no longer theirs after {timeout:g}s; "
                f"the layout stays migrating (daemons keep draining): run 'rebaser streams set {streams}' again "
                "to keep waiting, and see docs/operations.md if a shard has no daemon"
            )
        if left:
            progress(f"draining: {left} change sets still have work in their old shards")
        await asyncio.sleep(_DRAIN_POLL)
    layout = layout.settled()
    await write_layout(await _kv(js, subjects), subjects, layout, revision=revision)
    progress(f"settled at {streams} streams")
    await _delete_removed(js, subjects, streams, progress)
    for line in await spread_leaders(nc, js, subjects, layout.shards):
        progress(line)
    return layout


async def _kv(js: JetStreamContext, subjects: Subjects) -> Any:
    kv = await open_layout(js, subjects)
    if kv is None:
        raise LayoutMismatch("the layout bucket disappeared")
    return kv


def _retired_subject(stream: str) -> str:
    """What a removed shard's stream listens on once retired: a subject nothing publishes to."""
    return f"_REBASER_RETIRED.{stream}"


async def _retire_removed(
    js: JetStreamContext,
    subjects: Subjects,
    streams: int,
    shards: range,
    progress: Callable[[str], None],
) -> bool:
    """Retire the removed shards (``streams`` and above) before the layout settles; True if all are empty.

    Checking that a shard is empty and then deleting it would lose a request that a client still routing by the old
    layout got acknowledged in between. So each removed stream first stops listening on its subjects (a publish
    there gets no answer, and the client routes again by the layout it re-reads); only then is it checked. If a
    request landed before that, the subjects are given back and the drain goes on: the daemons serve every shard of
    a migrating layout, so that request is applied (in order) rather than stranded."""
    removed = [
        name
        for shard in shards
        if shard >= streams
        for name in (subjects.for_shard(shard).requests_stream, subjects.for_shard(shard).tasks_stream)
    ]
    retired: list[tuple[Any, list[str]]] = []
    for name in removed:
        try:
            config = (await js.stream_info(name)).config
        except NotFoundError:
            continue
        if config.subjects == [_retired_subject(name)]:
            continue  # retired by an earlier run that was interrupted
        original = list(config.subjects or [])
        await js.update_stream(dataclasses.replace(config, subjects=[_retired_subject(name)]))
        retired.append((config, original))
    busy = []
    for name in removed:
        with contextlib.suppress(NotFoundError):
            if (await js.stream_info(name)).state.messages:
                busy.append(name)
    if busy:
        for config, original in retired:
            await js.update_stream(dataclasses.replace(config, subjects=original))
        progress(f"{', '.join(busy)} got work while retiring: draining it first")
        return False
    return True


async def _delete_removed(
    js: JetStreamContext, subjects: Subjects, streams: int, progress: Callable[[str], None]
) -> None:
    """Delete the (retired, empty) streams of shards beyond ``streams`` (shards are numbered densely from 0)."""
    shard = streams
    while True:
        names = subjects.for_shard(shard)
        try:
            infos = [await js.stream_info(n) for n in (names.requests_stream, names.tasks_stream)]
        except NotFoundError:
            return
        if any(info.state.messages for info in infos):
            # Cannot happen once retired (nothing publishes to them); kept rather than risk a request.
            progress(f"shard {shard} still holds messages; its streams are kept (see docs/operations.md)")
        else:
            for name in (names.requests_stream, names.tasks_stream):
                await js.delete_stream(name)
            progress(f"deleted the streams of removed shard {shard}")
        shard += 1
