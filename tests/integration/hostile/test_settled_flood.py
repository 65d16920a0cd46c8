"""One workspace's flood of ``settled`` queries cannot take the waits a daemon holds for every workspace
(rebaser_server.queries.settled): it holds ``settled_max_waits_per_workspace`` of them, the rest are answered at once
("ask again", or settled if they are), and another workspace's wait is still answered."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_client import ChangeSetId, RebaserClient, SetLiteral, WorkspacePk
from rebaser_core.api import WAIT_SETTLED_REQUEST, WAIT_SETTLED_RESPONSE, ContentType, WaitSettledRequest
from rebaser_core.ids import RequestId
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.queries.settled import MAX_WAITS
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp


async def _flood(
    nc: NatsClient, settings: Settings, wk: WorkspacePk, cs: ChangeSetId, queries: int
) -> list[Msg]:
    """Send ``queries`` settled queries on one change set, each waiting up to a minute; the answers, as they come."""
    answers: list[Msg] = []
    inbox = nc.new_inbox()

    async def answered(msg: Msg) -> None:
        answers.append(msg)

    await nc.subscribe(f"{inbox}.*", cb=answered)
    subject = settings.subjects.api("settled", wk, cs)
    for n in range(queries):
        query = WaitSettledRequest(id=RequestId.new(), workspace_id=wk, change_set_id=cs, timeout=60)
        headers, body = WAIT_SETTLED_REQUEST.encode(query, ContentType.JSON)
        await nc.publish(subject, body, reply=f"{inbox}.{n}", headers=headers)
    await nc.flush()
    return answers


async def test_a_workspace_flooding_settled_waits_leaves_the_others_answered(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """At the default limits: workspace A asks 50 more than a daemon's MAX_WAITS on a change set that will not
    settle (its workspace is paused with a request queued). Before the per-workspace cap, A held every wait and B's
    wait_settled on a change set settled long ago got "ask again" until it timed out."""
    settings = fast_settings(subject_prefix)
    cap = settings.settled_max_waits_per_workspace
    assert cap == Settings().settled_max_waits_per_workspace == 100  # the default, not a test's
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        a, b = WorkspacePk.new(), WorkspacePk.new()
        a_cs, b_cs = ChangeSetId.new(), ChangeSetId.new()
        assert (
            await client.enqueue_updates_with_reply(b, b_cs, [SetLiteral(path="/b", value=1)], timeout=20)
        ).ok
        await client.pause_workspace(a)
        await client.enqueue_updates(a, a_cs, [SetLiteral(path="/a", value=1)])  # queued, never processed

        answers = await _flood(nc, settings, a, a_cs, MAX_WAITS + 50)
        waits = daemon.queries.settled
        await wait_for(
            lambda: len(answers) + waits.held == MAX_WAITS + 50,
            timeout=60,
            message="A's flood held or answered",
        )
        # B's change set, settled long ago, is answered so: its wait is B's own.
        settled = await client.wait_settled(b, b_cs, timeout=10)
        assert settled.settled and settled.error is None
        # A holds its share; everything over it was answered at once, without being held.
        assert (waits.held, len(answers)) == (cap, MAX_WAITS + 50 - cap)
        refused = [WAIT_SETTLED_RESPONSE.decode(msg.headers, msg.data) for msg in answers]
        assert all(r.error is not None and r.error.endswith("ask again") for r in refused), refused[0]
        assert "settled_max_waits_per_workspace" in (refused[0].error or "")
        # B's wait that must be held is held, beside A's share.
        b_next = ChangeSetId.new()
        await client.pause_change_set(b, b_next)
        await client.enqueue_updates(b, b_next, [SetLiteral(path="/b", value=2)])
        held = asyncio.create_task(client.wait_settled(b, b_next, timeout=30))
        await wait_for(lambda: waits.held == cap + 1, timeout=10, message="B's wait held")
        await client.resume_change_set(b, b_next)
        assert (await held).settled
        assert waits.held == cap


# Over the daemon's 1,000 held waits: slow (make chaos), the per-workspace flood above stays in make test.
@pytest.mark.slow
async def test_over_every_cap_a_settled_change_set_is_still_answered_settled(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    """When one workspace's share is the whole daemon's (a share of MAX_WAITS), a wait over the cap is still looked at
    once: a settled change set is answered settled at once, not "ask again"."""
    settings = fast_settings(subject_prefix, settled_max_waits_per_workspace=MAX_WAITS)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        a, a_cs = WorkspacePk.new(), ChangeSetId.new()
        b, b_cs = WorkspacePk.new(), ChangeSetId.new()
        assert (
            await client.enqueue_updates_with_reply(b, b_cs, [SetLiteral(path="/b", value=1)], timeout=20)
        ).ok
        await client.pause_workspace(a)
        await client.enqueue_updates(a, a_cs, [SetLiteral(path="/a", value=1)])
        answers = await _flood(nc, settings, a, a_cs, MAX_WAITS + 10)
        await wait_for(lambda: len(answers) == 10, timeout=30, message="the waits over MAX_WAITS answered")
        assert daemon.queries.settled.held == MAX_WAITS
        settled = await client.wait_settled(b, b_cs, timeout=10)
        assert settled.settled and settled.error is None
