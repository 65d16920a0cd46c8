"""What the query service keeps per workspace has a bound, driven past it here (docs/capacity.md, Bounds)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from rebaser_core.api import WaitSettledRequest
from rebaser_core.api.codec import ContentType
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_server.app import ChangeSet
from rebaser_server.queries import follow, gate, settled
from rebaser_server.queries.follow import FollowerConsumers
from rebaser_server.queries.gate import RequestGate
from rebaser_server.queries.settled import SettledWaits
from rebaser_server.testing import fast_settings


def test_the_followed_workspaces_are_bounded_and_the_least_recent_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(follow, "MAX_FOLLOWED_WORKSPACES", 4)
    followers = FollowerConsumers(nc=Any, settings=fast_settings(None, follow_creates_per_minute=1))  # type: ignore[arg-type]
    workspaces = [WorkspacePk.new() for _ in range(10)]
    assert all(followers._admit(w) for w in workspaces)  # each its first create of the minute
    assert followers.followed_workspaces == 4
    # The four most recent keep their minute's count: a second create is refused.
    assert not any(followers._admit(w) for w in workspaces[-4:])
    # One touched again stays; the least recently created goes first.
    followers._admit(workspaces[6])
    assert followers._admit(WorkspacePk.new()) and followers.followed_workspaces == 4
    assert not followers._admit(workspaces[6])


async def test_settled_waits_over_every_cap_are_bounded_then_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every wait over the caps (MAX_WAITS 0): MAX_LOOKS looks, then MAX_BUSY_ANSWERS "ask again" answers on their way,
    # then none at all. The looks' reads and the answers' publishes never end here, so each stays in flight.
    monkeypatch.setattr(settled, "MAX_WAITS", 0)
    monkeypatch.setattr(settled, "MAX_LOOKS", 2)
    monkeypatch.setattr(settled, "MAX_BUSY_ANSWERS", 3)
    never = asyncio.Event()

    async def reading_for_ever(*_: object, **__: object) -> None:
        await never.wait()

    class Publishing:
        async def publish(self, *_: object, **__: object) -> None:
            await never.wait()

    monkeypatch.setattr(settled, "settled_now", reading_for_ever)
    settings = fast_settings(None)
    waits = SettledWaits(Publishing(), Any, settings, SimpleNamespace(layout=None))  # type: ignore[arg-type]
    for _ in range(10):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        request = WaitSettledRequest(id=RequestId.new(), workspace_id=wk, change_set_id=cs, timeout=30)
        waits.start("_INBOX.caller.1", ChangeSet(wk, cs), request, ContentType.CBOR)
    await asyncio.sleep(0)  # (the tasks start)
    assert (len(waits._looks), len(waits._busy_answers), waits.dropped) == (2, 3, 5)
    never.set()
    await waits.stop()
    assert not waits._looks and not waits._busy_answers


async def test_the_gate_counts_a_bounded_number_of_workspaces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate, "_MAX_KEPT", 3)

    class Counting:
        async def count(self, workspace_id: WorkspacePk) -> int:
            return 1

    requests = RequestGate(Any, fast_settings(None, workspace_max_requests=10), Counting())  # type: ignore[arg-type]
    workspaces = [WorkspacePk.new() for _ in range(10)]
    for workspace in workspaces:
        requests._admitted[workspace] = 1  # admitted before the count
        await requests._count(workspace)
        assert len(requests._counts) <= 3
    assert list(requests._counts) == workspaces[-3:]
    assert set(requests._admitted) == set(workspaces[-3:])  # forgotten with its count
