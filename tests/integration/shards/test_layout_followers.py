"""The layout followers (the daemon's and the client's) and the orphan sweep end when stopped, even when a
cancellation is swallowed.

nats-py's ``request`` awaits ``asyncio.wait_for``, which on Python 3.11 drops a cancellation that arrives as the
answer does (see test_keepalive.py). A follower loop stopped only by its cancellation would then keep running:
the daemon's could re-assign a stopped daemon's shard pullers, and the client's would make ``close()`` wait for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client._routing import Router
from rebaser_core.layout import Layout
from rebaser_core.nats.layout_store import LayoutFollower
from rebaser_core.subjects import Subjects
from rebaser_core.testing import wait_for


async def _swallow_cancellation(entered: asyncio.Event) -> None:
    """A read that never answers by itself and swallows the first cancellation landing in it (later ones end the
    test's leftovers): a read in flight, which is where the cancellation must land."""
    if entered.is_set():
        await asyncio.Event().wait()
    entered.set()
    # What asyncio.wait_for does on Python 3.11 when the answer and the cancellation meet:
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.Event().wait()


async def test_the_daemons_layout_follower_stops(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered = asyncio.Event()

    async def refresh(self: LayoutFollower) -> Layout:
        await _swallow_cancellation(entered)
        return self.current

    monkeypatch.setattr(LayoutFollower, "refresh", refresh)
    follower = LayoutFollower(nc.jetstream(), Subjects(subject_prefix), Layout(), poll=0.01)
    follower.start()
    task = follower._task
    assert task is not None
    await asyncio.wait_for(entered.wait(), 5)  # the cancellation lands in a read
    await follower.stop()
    await wait_for(task.done, timeout=5, message="the follower loop ended")


async def test_the_clients_layout_follower_stops(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered = asyncio.Event()

    async def follow_once(self: Router) -> None:
        await _swallow_cancellation(entered)

    monkeypatch.setattr(Router, "_follow_once", follow_once)
    router = Router(nc, Subjects(subject_prefix))
    await router.start()
    await asyncio.wait_for(entered.wait(), 5)  # the cancellation lands in a read
    closing = asyncio.create_task(router.close())
    done, _ = await asyncio.wait({closing}, timeout=5)
    if not done:
        closing.cancel()  # cancels the poller again, in its sleep this time: the test's leftovers end
    assert done, "close() waits for a poller that outlived its cancellation"


async def test_the_orphan_sweep_stops_with_its_daemon(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rebaser_server.daemon.sweeper import Sweeper
    from rebaser_server.testing import fast_settings, running_daemon
    from tests.support.apps import RecordingApp

    entered = asyncio.Event()
    swallowed: list[bool] = []

    async def sweep_once(self: Sweeper) -> int:
        entered.set()
        try:
            await asyncio.Event().wait()  # a sweep in hand, answering only to its cancellation
        except asyncio.CancelledError:
            if swallowed:
                raise  # only the first cancellation is swallowed: later ones end the test's leftovers
            swallowed.append(True)
        return 0

    monkeypatch.setattr(Sweeper, "sweep_once", sweep_once)
    async with running_daemon(
        nc, fast_settings(subject_prefix, sweep_interval=0.05), RecordingApp()
    ) as daemon:
        task = daemon._sweeper_task
        assert task is not None
        await asyncio.wait_for(entered.wait(), 5)
    await wait_for(task.done, timeout=5, message="the sweep loop ended with its daemon")


async def test_a_layout_not_read_lately_is_read_again_before_routing(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client whose reads fail (or that was disconnected) for longer than a layout change takes to settle may
    have missed it: its old layout's shard may no longer be served. It routes nothing by a layout that old."""
    from rebaser_client._routing import MAX_LAYOUT_AGE
    from rebaser_core.errors import RebaserUnavailable
    from rebaser_core.ids import ChangeSetId, WorkspacePk

    router = Router(nc, Subjects(subject_prefix))
    await router.start()  # no deployment here: no layout, which is an answer
    try:
        assert router.known
        monkeypatch.setattr(router, "_read_at", time.monotonic() - MAX_LAYOUT_AGE - 1)  # reads failed since
        assert not router.known
        request = Subjects(subject_prefix).requests(WorkspacePk.new(), ChangeSetId.new())
        with pytest.raises(RebaserUnavailable, match="shard layout has not been read"):
            router.reroute(request, {})
        await router.confirm()  # what an enqueue does first: one read now
        assert router.known
        assert router.reroute(request, {})[0] == request
    finally:
        await router.close()


@pytest.mark.parametrize("tracing", [False, True])
async def test_an_enqueue_is_not_routed_by_a_layout_not_read_lately(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch, tracing: bool
) -> None:
    """Connected, but the layout could not be read for longer than a layout change takes to settle: the request is
    refused (no spool here), not published by that old layout, whether or not tracing is on (each has its path)."""
    from opentelemetry.sdk.trace import TracerProvider

    import rebaser_client._routing as routing
    from rebaser_client import RebaserClient
    from rebaser_core.errors import RebaserUnavailable
    from rebaser_core.ids import ChangeSetId, WorkspacePk
    from rebaser_core.nats.streams import ensure_streams
    from rebaser_core.settings import Settings

    await ensure_streams(nc.jetstream(), Settings(prefix=subject_prefix, storage="memory"))
    provider = TracerProvider() if tracing else None
    async with RebaserClient(nc, prefix=subject_prefix, tracer_provider=provider) as client:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        await client.enqueue_updates(wk, cs, [])  # the layout is read: published
        router = client._router
        monkeypatch.setattr(router, "_read_at", time.monotonic() - routing.MAX_LAYOUT_AGE - 1)

        async def read_fails(*args: object, **kwargs: object) -> None:
            raise TimeoutError("layout read timed out")

        monkeypatch.setattr(routing, "fetch_layout", read_fails)
        with pytest.raises(RebaserUnavailable, match="shard layout has not been read"):
            await client.enqueue_updates(wk, cs, [])
    info = await nc.jetstream().stream_info(Subjects(subject_prefix).requests_stream)
    assert info.state.messages == 1


async def test_a_burst_of_enqueues_on_a_stale_layout_shares_one_read(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thousand enqueues that find the layout stale (the client's event loop was busy) make one read between
    them, not one each: a thousand reads on a busy connection would each time out and refuse every request."""
    import rebaser_client._routing as routing

    router = Router(nc, Subjects(subject_prefix))
    await router.start()
    real_fetch = routing.fetch_layout
    reads = 0
    gate = asyncio.Event()

    async def counted_fetch(*args: object, **kwargs: object) -> Layout | None:
        nonlocal reads
        reads += 1
        await gate.wait()  # held until every caller has asked
        return await real_fetch(*args, **kwargs)  # type: ignore[arg-type]

    try:
        _stale_with_reads_by(router, counted_fetch, monkeypatch)
        callers = [asyncio.create_task(router.confirm()) for _ in range(1000)]
        await wait_for(lambda: reads > 0, timeout=5, message="the shared read started")
        gate.set()
        await asyncio.wait_for(asyncio.gather(*callers), 10)
        assert router.known
        assert reads == 1
    finally:
        gate.set()
        await router.close()


async def test_a_layout_read_that_times_out_is_tried_again_before_refusing(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connected, with a read that timed out (NATS slow, not gone): the enqueue reads again rather than refuse."""
    import rebaser_client._routing as routing

    router = Router(nc, Subjects(subject_prefix))
    await router.start()
    real_fetch = routing.fetch_layout
    reads = 0

    async def slow_once(*args: object, **kwargs: object) -> Layout | None:
        nonlocal reads
        reads += 1
        if reads == 1:
            raise TimeoutError("layout read timed out")
        return await real_fetch(*args, **kwargs)  # type: ignore[arg-type]

    try:
        _stale_with_reads_by(router, slow_once, monkeypatch)
        await router.confirm()
        assert router.known
        assert reads == 2
    finally:
        await router.close()


def _stale_with_reads_by(router: Router, fetch: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """The router's layout read too long ago, its reads made by ``fetch``, and its follower (one read a second)
    stopped, so that only the reads the test asks for are counted."""
    import rebaser_client._routing as routing

    monkeypatch.setattr(routing, "fetch_layout", fetch)
    monkeypatch.setattr(router, "_closed", True)
    monkeypatch.setattr(router, "_read_at", time.monotonic() - routing.MAX_LAYOUT_AGE - 1)
