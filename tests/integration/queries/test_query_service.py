"""Queries are answered side by side within a bound: a slow one holds up no other, and past the bound a query is
answered at once with RebaserBusy(limit="queries"), never queued (a queue that grew was the daemon's memory growing
without end under steady load)."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserBusy, RebaserClient, RebaserTimeout, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet, ChangeSetView
from rebaser_server.queries import service
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp


class SlowDescribeApp(RecordingApp):
    """A ``get`` of the path ``/slow`` waits until the test opens the gate; any other answers at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = 0

    async def describe(self, change_set: ChangeSet, state: object, path: str | None) -> ChangeSetView:
        if path == "/slow":
            self.waiting += 1
            await self.gate.wait()
        return ChangeSetView(values={"path": path})


async def _slow_gets(
    client: RebaserClient, app: SlowDescribeApp, count: int
) -> tuple[WorkspacePk, ChangeSetId, list[asyncio.Task[Any]]]:
    """A change set with one request applied, and ``count`` slow ``get``s of it under way (held by ``app``)."""
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    assert (await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=1)])).ok
    slow = [asyncio.create_task(client.get_change_set(wk, cs, "/slow", timeout=30)) for _ in range(count)]
    await wait_for(lambda: app.waiting == count, message=f"{count} slow gets under way")
    return wk, cs, slow


async def test_a_slow_query_holds_up_no_other(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    app = SlowDescribeApp()
    async with running_daemon(nc, fast_settings(subject_prefix), app) as daemon:
        wk, cs, slow = await _slow_gets(client, app, 3)
        # Answered one after another, this one would wait for the three.
        quick = await client.get_change_set(wk, cs, "/quick", timeout=5)
        assert quick.values == {"path": "/quick"}
        assert not any(task.done() for task in slow)
        assert daemon.queries.answering == 3
        app.gate.set()
        for answer in await asyncio.gather(*slow):
            assert answer.values == {"path": "/slow"}
        await wait_for(lambda: daemon.queries.answering == 0, message="nothing left under way")


async def test_past_the_bounds_a_query_waits_then_is_refused_at_once_then_dropped(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "MAX_QUERIES_IN_FLIGHT", 2)
    monkeypatch.setattr(service, "MAX_QUERIES_WAITING", 1)
    monkeypatch.setattr(service, "MAX_REFUSALS_IN_FLIGHT", 0)  # no room for a refusal: dropped
    app = SlowDescribeApp()
    async with running_daemon(nc, fast_settings(subject_prefix), app) as daemon:
        wk, cs, slow = await _slow_gets(client, app, 2)
        waiting = asyncio.create_task(client.get_change_set(wk, cs, "/waits", timeout=30))
        await wait_for(lambda: daemon.queries.waiting == 1, message="the third waits")
        # No room to wait, none for a refusal: the query is dropped, not queued, and its caller's timeout answers it.
        with pytest.raises(RebaserTimeout, match="no answer within"):
            await client.get_change_set(wk, cs, "/quick", timeout=0.5)
        assert daemon.queries.dropped == 1 and daemon.queries.refused == 0
        monkeypatch.setattr(service, "MAX_REFUSALS_IN_FLIGHT", 16)
        with pytest.raises(RebaserBusy) as busy:
            await client.get_change_set(wk, cs, "/quick", timeout=5)
        assert busy.value.limit == "queries" and "2 queries at once" in str(busy.value)
        assert daemon.queries.refused == 1 and not waiting.done()
        app.gate.set()
        await asyncio.gather(*slow)
        assert (await waiting).values == {"path": "/waits"}  # answered once a slot freed
        await wait_for(lambda: daemon.queries.answering == 0, message="the slow gets answered")
        # Room again: answered as usual.
        assert (await client.get_change_set(wk, cs, "/quick", timeout=5)).values == {"path": "/quick"}


async def test_a_flood_of_queries_holds_a_bounded_number_and_every_caller_gets_an_answer_or_its_timeout(
    nc: NatsClient, nats_url: str, client: RebaserClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "MAX_QUERIES_IN_FLIGHT", 4)
    monkeypatch.setattr(service, "MAX_QUERIES_WAITING", 10)
    monkeypatch.setattr(service, "MAX_REFUSALS_IN_FLIGHT", 8)
    app = SlowDescribeApp()
    async with running_daemon(nc, fast_settings(subject_prefix), app) as daemon:
        wk, cs, slow = await _slow_gets(client, app, 4)
        # 500 queries at once from another connection: 10 wait, the others are refused or dropped at once.
        flooder = await nats.connect(nats_url)
        flood = RebaserClient(flooder, prefix=subject_prefix, check_workspace_backlog=False)
        try:
            outcomes = asyncio.gather(
                *(flood.get_change_set(wk, cs, "/quick", timeout=4) for _ in range(500)),
                return_exceptions=True,
            )
            queries = daemon.queries
            await wait_for(lambda: queries.refused + queries.dropped == 490, message="490 refused or dropped")
            assert queries.waiting == 10 and queries.answering == 4
            app.gate.set()
            results = await outcomes
        finally:
            await flood.close()
            await flooder.close()
        answered = [r for r in results if not isinstance(r, BaseException)]
        busy = [r for r in results if isinstance(r, RebaserBusy)]
        assert len(answered) == 10 and all(r.values == {"path": "/quick"} for r in answered)
        assert len(busy) == daemon.queries.refused >= 1
        assert len(results) - len(answered) - len(busy) == daemon.queries.dropped  # each timed out
        assert all(isinstance(r, RebaserTimeout) for r in results if r not in answered and r not in busy)
        await asyncio.gather(*slow)
