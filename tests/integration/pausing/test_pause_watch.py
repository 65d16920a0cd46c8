"""Reading the pauses bucket when its values reach the client after the watch's consumer info (a real nats-server).

The server counts a value as delivered when it queues it, so the answer to nats-py's consumer info can overtake the
values: nats-py then says "initial values loaded" before any came. ``late_values`` makes that happen every time, by
asking for the consumer info only once the values have arrived, and reading them only after its answer.
Before rebaser_core.nats.bucket_watch, ``rebaser status`` listed no pauses then (seen once in CI), and a starting
daemon took a paused change set for unpaused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.js.kv import KeyValue

from rebaser_client._pause_read import all_pauses
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.bucket_watch import watch_bucket
from rebaser_core.nats.pause_store import open_pauses
from rebaser_core.pauses import Pause, change_set_key, workspace_key
from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet
from rebaser_server.daemon.pauses import PauseWatcher
from rebaser_server.testing import fast_settings


async def _bucket(nc: NatsClient, settings: Settings) -> KeyValue:
    kv = await open_pauses(nc.jetstream(), settings.subjects, create=True, storage=settings.storage)
    assert kv is not None
    return kv


async def _paused(
    nc: NatsClient, settings: Settings, *, workspace_too: bool
) -> tuple[WorkspacePk, ChangeSetId]:
    """A change set paused ("bad data"), and with ``workspace_too`` its workspace ("freeze"), in the bucket."""
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    kv = await _bucket(nc, settings)
    await kv.put(change_set_key(wk, cs), Pause.now("operator", "bad data").encode())
    if workspace_too:
        await kv.put(workspace_key(wk), Pause.now("operator", "freeze").encode())
    return wk, cs


@contextmanager
def late_values(nc: NatsClient, values: int) -> Iterator[list[str]]:
    """Make the KV watch's consumer info overtake its ``values`` values: they are held unread as they arrive, the
    consumer info is asked once all have arrived (so the server has delivered them all: nothing is pending), and
    they are read only after its answer. Yields the subjects of the values held."""
    process, request = nc._process_msg, nc.request
    held: list[tuple[Any, ...]] = []
    all_arrived = asyncio.Event()
    overtaken: list[str] = []
    tasks: set[asyncio.Task[None]] = set()
    released = False

    async def holding(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes) -> None:
        if released or not subject.startswith(b"$KV."):
            await process(sid, subject, reply, data, headers)
            return
        held.append((sid, subject, reply, data, headers))
        if len(held) >= values:
            all_arrived.set()

    async def asking_late(subject: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal released
        if released or not subject.startswith("$JS.API.CONSUMER.INFO.KV_"):
            return await request(subject, *args, **kwargs)
        await asyncio.wait_for(all_arrived.wait(), 10)
        answer = await request(subject, *args, **kwargs)
        released = True
        for args_ in held:  # read after nats-py has looked at the answer (it goes on as this returns)
            overtaken.append(args_[1].decode())
            task = asyncio.ensure_future(process(*args_))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        return answer

    nc._process_msg = holding  # type: ignore[method-assign]
    nc.request = asking_late  # type: ignore[method-assign]
    try:
        yield overtaken
    finally:
        nc._process_msg, nc.request = process, request  # type: ignore[method-assign]


async def test_status_lists_every_pause_when_the_values_come_after_the_consumer_info(
    nc: NatsClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    _, cs = await _paused(nc, settings, workspace_too=True)
    with late_values(nc, 2) as overtaken:
        paused, more = await all_pauses(nc.jetstream(), settings.subjects, timeout=5)
    assert overtaken, "the values were not held: the test did not reorder anything"
    assert {(p.change_set_id, p.pause.reason) for p in paused} == {(str(cs), "bad data"), (None, "freeze")}
    assert not more


async def test_a_starting_daemon_knows_every_pause_when_the_values_come_after_the_consumer_info(
    nc: NatsClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    wk, cs = await _paused(nc, settings, workspace_too=False)
    watcher = PauseWatcher(nc.jetstream(), settings, lambda *_: None)
    with late_values(nc, 1) as overtaken:
        await watcher.start()
    try:
        assert overtaken
        pause = watcher.paused(ChangeSet(wk, cs))
        assert pause is not None and pause.reason == "bad data"
    finally:
        await watcher.stop()


async def test_the_initial_values_end_once_when_the_last_entry_is_a_delete(
    nc: NatsClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    kv = await _bucket(nc, settings)
    await kv.put("kept", b"1")
    await kv.put("gone", b"2")
    await kv.delete("gone")
    with late_values(nc, 2) as overtaken:
        watcher = await watch_bucket(kv, ignore_deletes=True)
        try:
            seen = []
            while (entry := await watcher.updates(timeout=5)) is not None:
                seen.append(entry.key)
            assert overtaken and seen == ["kept"]
            await kv.put("later", b"3")
            later = await watcher.updates(
                timeout=5
            )  # a change, with no second end-of-values marker before it
            assert later is not None and later.key == "later"
        finally:
            await watcher.stop()


async def test_an_empty_bucket_ends_its_initial_values_at_once(nc: NatsClient, subject_prefix: str) -> None:
    settings = fast_settings(subject_prefix)
    kv = await _bucket(nc, settings)
    watcher = await watch_bucket(kv)
    try:
        assert await watcher.updates(timeout=5) is None
        await kv.put("first", b"1")
        first = await watcher.updates(timeout=5)
        assert first is not None and first.key == "first"
    finally:
        await watcher.stop()
