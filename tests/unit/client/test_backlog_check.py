"""The client's side of a workspace's request limit (rebaser_client._backlog) for a client of very many workspaces:
what it asks follows what it sends, not how many workspaces it sends to (and while every workspace together is far
below the limit, nothing per workspace); the counts it keeps are bounded, and the one it forgets is the one used
longest ago, never one in use (a workspace at its limit whose count was forgotten passed the check)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rebaser_client import _backlog
from rebaser_client._backlog import BacklogCheck
from rebaser_core.api import MessageVersion, VersionedMessage, WorkspaceBacklogResponse
from rebaser_core.errors import RebaserBusy
from rebaser_core.ids import ChangeSetId, WorkspacePk

LIMIT = 10


class Daemon:
    """Answers ``backlog`` queries: ``full`` is at its limit, every other workspace has nothing queued."""

    def __init__(self, full: WorkspacePk, total: int | None = None, limit: int = LIMIT) -> None:
        self.full = full
        self.total = total  # every workspace's queued requests (None: a daemon that answers version 1 only)
        self.limit = limit
        self.asked = 0

    async def ask(
        self,
        operation: str,
        request: MessageVersion,
        codec: VersionedMessage[Any],
        reply_codec: VersionedMessage[Any],
        timeout: float,
    ) -> WorkspaceBacklogResponse:
        self.asked += 1
        wk = request.workspace_id  # type: ignore[attr-defined]
        queued = self.limit if wk == self.full else 0
        return WorkspaceBacklogResponse(
            id=request.id,
            workspace_id=wk,
            change_set_id=request.change_set_id,  # type: ignore[attr-defined]
            queued=queued,
            limit=self.limit,
            total_queued=self.total,
        )


async def test_a_workspace_in_use_keeps_its_count_while_a_client_sends_to_very_many(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_backlog, "_MAX_KEPT", 5)
    monkeypatch.setattr(_backlog, "FIRST_ASK_AFTER", 0)  # every workspace counted from its first request
    full = WorkspacePk.new()
    daemon = Daemon(full)
    check = BacklogCheck(daemon)  # type: ignore[arg-type]
    try:
        await check.check(full, ChangeSetId.new())  # its first request goes (no count yet) and asks for one
        await asyncio.gather(*check._asking.values())
        refused = 0
        for _ in range(40):
            # Other workspaces come and go between two requests of the full one: more than the client keeps.
            for _ in range(3):
                await check.check(WorkspacePk.new(), ChangeSetId.new())
            # Their counts asked for and kept (the client asks in the background).
            await asyncio.gather(*check._asking.values())
            await asyncio.sleep(0)
            try:
                await check.check(full, ChangeSetId.new())
            except RebaserBusy as busy:
                assert busy.workspace == str(full)
                refused += 1
        assert refused == 40
        assert len(check._sent) <= 5
    finally:
        await check.close()


async def test_a_client_sending_a_few_requests_to_each_of_many_workspaces_asks_no_count() -> None:
    daemon = Daemon(WorkspacePk.new())
    check = BacklogCheck(daemon)  # type: ignore[arg-type]
    try:
        for _ in range(2_000):
            workspace = WorkspacePk.new()
            for _ in range(2):
                await check.check(workspace, ChangeSetId.new())
                check.sent(workspace)
        assert daemon.asked == 0
    finally:
        await check.close()


async def test_a_client_flooding_a_full_workspace_is_refused_after_a_few_requests_and_one_count() -> None:
    full = WorkspacePk.new()
    daemon = Daemon(full)
    check = BacklogCheck(daemon)  # type: ignore[arg-type]
    try:
        sent = 0
        with pytest.raises(RebaserBusy) as busy:
            for _ in range(1_000):
                await check.check(full, ChangeSetId.new())
                check.sent(full)
                sent += 1
                await asyncio.sleep(0)  # the count asked in the background arrives
        assert busy.value.workspace == str(full)
        assert _backlog.FIRST_ASK_AFTER <= sent <= _backlog.FIRST_ASK_AFTER + 2
        assert daemon.asked == 1
    finally:
        await check.close()


async def _send(check: BacklogCheck, workspace: WorkspacePk, requests: int) -> None:
    for _ in range(requests):
        await check.check(workspace, ChangeSetId.new())
        check.sent(workspace)
        await asyncio.sleep(0)  # a count asked in the background arrives


async def test_while_every_workspace_together_is_far_below_the_limit_no_workspace_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    daemon = Daemon(WorkspacePk.new(), total=40, limit=100_000)
    check = BacklogCheck(daemon)  # type: ignore[arg-type]
    try:
        # 500 workspaces, each sent more than FIRST_ASK_AFTER requests: one count in all (the first workspace's,
        # which says that every workspace together has 40 queued).
        for _ in range(500):
            await _send(check, WorkspacePk.new(), _backlog.FIRST_ASK_AFTER + 4)
        assert daemon.asked == 1
        # Once the total is RECOUNT_AFTER old it is asked for again, once, whatever the workspaces.
        monkeypatch.setattr(_backlog, "RECOUNT_AFTER", 0.0)
        await _send(check, WorkspacePk.new(), 1)
        await asyncio.gather(*check._asking.values())
        assert daemon.asked == 2
    finally:
        await check.close()


async def test_a_total_near_half_the_limit_counts_each_workspace_again() -> None:
    daemon = Daemon(WorkspacePk.new(), total=50_000, limit=100_000)
    check = BacklogCheck(daemon)  # type: ignore[arg-type]
    try:
        for _ in range(20):
            await _send(check, WorkspacePk.new(), _backlog.FIRST_ASK_AFTER + 1)
        assert daemon.asked == 20  # each workspace's first count, as with no total
    finally:
        await check.close()


async def test_what_this_client_sent_since_the_total_brings_it_to_half_the_limit() -> None:
    daemon = Daemon(WorkspacePk.new(), total=0, limit=1_000)
    check = BacklogCheck(daemon)  # type: ignore[arg-type]
    try:
        await _send(check, WorkspacePk.new(), _backlog.FIRST_ASK_AFTER + 1)
        assert daemon.asked == 1
        # 499 more sent since the total (nothing queued): still under half the limit, nothing asked ...
        for _ in range(30):
            await _send(check, WorkspacePk.new(), _backlog.FIRST_ASK_AFTER)
        assert check._sent_all - check._total.sent_before < 500  # type: ignore[union-attr]
        before = daemon.asked
        # ... then past it, each workspace is counted again once it has had FIRST_ASK_AFTER requests.
        for _ in range(10):
            await _send(check, WorkspacePk.new(), _backlog.FIRST_ASK_AFTER + 1)
        assert daemon.asked > before
    finally:
        await check.close()


async def test_a_full_workspace_is_refused_though_the_others_are_far_below_its_limit() -> None:
    full = WorkspacePk.new()
    daemon = Daemon(full, total=LIMIT, limit=LIMIT)  # every queued request is the full workspace's
    check = BacklogCheck(daemon)  # type: ignore[arg-type]
    try:
        with pytest.raises(RebaserBusy) as busy:
            await _send(check, full, 1_000)
        assert busy.value.workspace == str(full)
    finally:
        await check.close()
