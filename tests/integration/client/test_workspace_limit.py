"""A workspace's queued requests are bounded (``workspace_max_requests``): over its limit a workspace gets
``RebaserBusy`` naming the limit and the workspace, other workspaces never do, and it is taken again once it drains."""

from __future__ import annotations

import time

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserBusy, RebaserClient, SetLiteral
from rebaser_core.api import (
    WORKSPACE_BACKLOG_REQUEST,
    ContentType,
    VersionedMessage,
    WorkspaceBacklogRequestV1,
    WorkspaceBacklogResponseV1,
)
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp

LIMIT = 12


async def _until_busy(
    client: RebaserClient, wk: WorkspacePk, deadline: float = 20.0
) -> tuple[RebaserBusy, int]:
    """Enqueue to ``wk`` (over fresh change sets) until the client refuses; the refusal and how many were sent."""
    sent, give_up = 0, time.monotonic() + deadline
    while time.monotonic() < give_up:
        try:
            await client.enqueue_updates(wk, ChangeSetId.new(), [SetLiteral(path="/n", value=sent)])
        except RebaserBusy as busy:
            return busy, sent
        sent += 1
    raise AssertionError(f"{sent} requests sent to {wk} and none refused within {deadline}s")


async def test_a_workspace_over_its_limit_is_busy_and_no_other_is(
    nc: NatsClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, workspace_max_requests=LIMIT, streams=2)
    flooding, other = WorkspacePk.new(), WorkspacePk.new()
    async with (
        running_daemon(nc, settings, RecordingApp()),
        RebaserClient(nc, prefix=subject_prefix) as client,  # made once the layout (two shards) exists
    ):
        await client.pause_workspace(flooding)  # its requests are taken and kept, none processed
        busy, sent = await _until_busy(client, flooding)
        assert busy.limit == "workspace_requests" and busy.workspace == str(flooding)
        assert f"its limit is {LIMIT} (workspace_max_requests)" in str(busy)
        # Counted over both shards: the requests landed in each.
        assert sent >= LIMIT

        async def counted() -> bool:  # a daemon's count is at most a moment old
            backlog = await client.workspace_backlog(flooding)
            return backlog.limit == LIMIT and backlog.queued == sent

        await wait_for(counted, timeout=10, message=f"{sent} requests counted")
        js = nc.jetstream()
        per_shard = []
        for names in (settings.subjects.for_shard(0), settings.subjects.for_shard(1)):
            filtered = names.requests_of_workspace(flooding)
            info = await js.stream_info(names.requests_stream, subjects_filter=filtered)
            per_shard.append(sum((info.state.subjects or {}).values()))
        assert sum(per_shard) == sent and all(per_shard), per_shard
        # Another workspace is never refused, also while the first one stays over its limit.
        for n in range(3 * LIMIT):
            cs = ChangeSetId.new()
            await client.enqueue_updates(other, cs, [SetLiteral(path="/n", value=n)])
        assert (
            await client.enqueue_updates_with_reply(other, cs, [SetLiteral(path="/n", value=0)], timeout=20)
        ).ok
        # The flooding workspace drains once resumed, and is taken again.
        await client.resume_workspace(flooding)

        async def taken_again() -> bool:
            try:
                await client.enqueue_updates(flooding, ChangeSetId.new(), [SetLiteral(path="/n", value=0)])
            except RebaserBusy:
                return False
            return True

        await wait_for(taken_again, timeout=30, message="the drained workspace's requests taken again")


async def test_without_a_limit_nothing_is_refused(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, workspace_max_requests=-1)
    wk = WorkspacePk.new()
    async with running_daemon(nc, settings, RecordingApp()):
        await client.pause_workspace(wk)
        for n in range(3 * LIMIT):
            await client.enqueue_updates(wk, ChangeSetId.new(), [SetLiteral(path="/n", value=n)])

        async def counted() -> bool:
            backlog = await client.workspace_backlog(wk)
            return (backlog.queued, backlog.limit) == (3 * LIMIT, 0)

        await wait_for(counted, timeout=10, message="every request counted, no limit")


async def test_the_count_says_every_workspaces_total_and_a_version_1_asker_gets_version_1(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, workspace_max_requests=LIMIT, streams=2)
    one, two = WorkspacePk.new(), WorkspacePk.new()
    async with running_daemon(nc, settings, RecordingApp()):
        for wk, requests in ((one, 5), (two, 4)):
            await client.pause_workspace(wk)
            for n in range(requests):
                await client.enqueue_updates(wk, ChangeSetId.new(), [SetLiteral(path="/n", value=n)])

        async def counted() -> bool:  # over both shards, at most a moment old
            backlog = await client.workspace_backlog(one)
            return (backlog.queued, backlog.total_queued, backlog.limit) == (5, 9, LIMIT)

        await wait_for(counted, timeout=10, message="5 of the workspace's, 9 in all")
        # A client that knows version 1 only (an older one) asks in version 1 and reads the answer.
        query = WorkspaceBacklogRequestV1(
            id=RequestId.new(), workspace_id=two, change_set_id=ChangeSetId.new()
        )
        headers, body = WORKSPACE_BACKLOG_REQUEST.encode(query, ContentType.JSON)
        assert headers["X-MESSAGE-VERSION"] == "1"
        reply = await nc.request(
            settings.subjects.api("backlog", two, query.change_set_id), body, 5, headers=headers
        )
        assert reply.headers is not None and reply.headers["X-MESSAGE-VERSION"] == "1"
        old_client = VersionedMessage(
            "WorkspaceBacklogResponse", (WorkspaceBacklogResponseV1,), WorkspaceBacklogResponseV1
        )
        answer = old_client.decode(reply.headers, reply.data)
        assert (answer.id, answer.queued, answer.limit, answer.error) == (query.id, 4, LIMIT, None)
