"""The client's side of a workspace's request limit (rebaser_client._backlog) for a client of very many workspaces:
what it asks follows what it sends, not how many workspaces it sends to; the counts it keeps are bounded, and the one
it forgets is the one used longest ago, never one in use (a workspace at its limit whose count was forgotten passed
the check)."""

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

    def __init__(self, full: WorkspacePk) -> None:
        self.full = full
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
        queued = LIMIT if wk == self.full else 0
        return WorkspaceBacklogResponse(
            id=request.id,
            workspace_id=wk,
            change_set_id=request.change_set_id,  # type: ignore[attr-defined]
            queued=queued,
            limit=LIMIT,
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
