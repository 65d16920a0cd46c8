"""A workspace's queued-request limit (``workspace_max_requests``) holds for a caller that does not play along: in an
account of its own, a caller's requests reach the stream only through the daemons' gate
(rebaser_server.queries.gate), so raw publishes past the limit are refused, and the other workspaces are served."""

from __future__ import annotations

import json
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_client import RebaserBusy, RebaserClient, SetLiteral
from rebaser_core.api import ENQUEUE_UPDATES_REQUEST, ContentType, EnqueueUpdatesRequest, InlineUpdates
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, RequestId
from rebaser_core.testing import wait_for
from rebaser_server.queries import gate
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.accounts import (
    CONFINED,
    accounts_server,
    connect_as,
    daemon_nc,
    other_tenant_works,
    request_answered,
)
from tests.support.apps import RecordingApp

__all__ = ["accounts_server", "daemon_nc"]  # fixtures

LIMIT = 40


def _request(change_set: ChangeSetId) -> tuple[dict[str, str], bytes]:
    request = EnqueueUpdatesRequest(
        id=RequestId.new(),
        workspace_id=CONFINED,
        change_set_id=change_set,
        updates=InlineUpdates(updates=[SetLiteral(path="/n", value=1)]),
    )
    return ENQUEUE_UPDATES_REQUEST.encode(request, ContentType.CBOR)


async def test_raw_publishes_past_the_workspace_limit_are_refused_and_others_are_served(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    settings = fast_settings(None, workspace_max_requests=LIMIT)
    names = settings.subjects
    attacker = await connect_as(accounts_server, "workspace-1")
    try:
        async with running_daemon(daemon_nc, settings, RecordingApp()) as daemon:
            # The workspace is paused, so what it queues stays queued (nothing drains the count).
            async with RebaserClient(daemon_nc) as operator:
                await operator.pause_workspace(CONFINED, "held while it floods")
            answers = []
            for _ in range(4 * LIMIT):  # raw JetStream publishes, no client and no backlog check
                change_set = ChangeSetId.new()
                headers, body = _request(change_set)
                reply = await request_answered(
                    attacker, names.requests(CONFINED, change_set), body, headers=headers
                )
                answers.append(json.loads(reply.data))
            stored = [a for a in answers if "seq" in a]
            refused = [a for a in answers if a.get("error", {}).get("err_code") == 10077]
            assert len(stored) + len(refused) == len(answers), answers[:3]
            assert LIMIT <= len(stored) <= LIMIT + LIMIT // 2, len(stored)
            assert "per workspace" in refused[0]["error"]["description"]
            assert daemon.queries.gate.refused == len(refused)
            info = await daemon_nc.jetstream().stream_info(
                names.requests_stream, subjects_filter=names.requests_of_workspace(CONFINED)
            )
            assert sum((info.state.subjects or {}).values()) == len(stored)

            # Its own client says so in the client's terms, naming the workspace ...
            async with RebaserClient(attacker, check_workspace_backlog=False) as client:
                try:
                    await client.enqueue_updates(
                        CONFINED, ChangeSetId.new(), [SetLiteral(path="/n", value=2)]
                    )
                except RebaserBusy as busy:
                    assert (busy.limit, busy.workspace) == ("workspace_requests", str(CONFINED)), busy
                else:
                    raise AssertionError("a request past the workspace's limit was queued")
            # ... and another workspace's caller is served as ever.
            await other_tenant_works(accounts_server)
    finally:
        await attacker.close()


async def test_a_burst_past_what_the_gate_passes_on_at_once_is_answered_busy_never_queued(
    accounts_server: NatsServer, daemon_nc: NatsClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gate, "_MAX_IN_FLIGHT", 4)
    settings = fast_settings(None, workspace_max_requests=-1)
    names = settings.subjects
    attacker = await connect_as(accounts_server, "workspace-1")
    answers: list[dict[str, Any]] = []

    async def answered(msg: Msg) -> None:
        answers.append(json.loads(msg.data))

    try:
        async with running_daemon(daemon_nc, settings, RecordingApp()) as daemon:
            async with RebaserClient(daemon_nc) as operator:
                await operator.pause_workspace(CONFINED, "held while it floods")
            inbox = attacker.new_inbox()
            await attacker.subscribe(f"{inbox}.*", cb=answered)
            for n in range(300):  # raw publishes, none waiting for its answer
                change_set = ChangeSetId.new()
                headers, body = _request(change_set)
                await attacker.publish(names.requests(CONFINED, change_set), body, f"{inbox}.{n}", headers)
            await attacker.flush()
            queries = daemon.queries.gate
            await wait_for(lambda: len(answers) + queries.dropped == 300, timeout=30, message="each answered")
            busy = [a for a in answers if a.get("error", {}).get("err_code") == 10023]
            stored = [a for a in answers if "seq" in a]
            assert busy and len(busy) + len(stored) == len(answers), answers[:3]
            assert queries.admitted == len(stored) and not queries._tasks
            info = await daemon_nc.jetstream().stream_info(
                names.requests_stream, subjects_filter=names.requests_of_workspace(CONFINED)
            )
            assert sum((info.state.subjects or {}).values()) == len(stored)
    finally:
        await attacker.close()


async def test_far_below_the_limit_in_all_the_gate_counts_nothing_per_workspace(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    settings = fast_settings(None, workspace_max_requests=1_000)
    names = settings.subjects
    caller = await connect_as(accounts_server, "workspace-1")
    try:
        async with running_daemon(daemon_nc, settings, RecordingApp()) as daemon:
            for _ in range(30):
                change_set = ChangeSetId.new()
                headers, body = _request(change_set)
                reply = await request_answered(
                    caller, names.requests(CONFINED, change_set), body, headers=headers
                )
                assert "seq" in json.loads(reply.data), reply.data
            gate_ = daemon.queries.gate
            # Every workspace together is far below half of 1,000: no count of the workspace, nothing kept for it.
            assert gate_.admitted == 30 and not gate_._counts and not gate_._admitted
            assert gate_._total is not None and gate_._admitted_all == 30
    finally:
        await caller.close()
