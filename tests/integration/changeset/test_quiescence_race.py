"""Design-notes §3: a request published while its change set is being released must not be stranded.

The daemon is paused at the exact points of the release (after it stopped consuming, before the task ack; and
after the ack, before the final queued check), a request is published inside that window, and then the daemon
goes on. The orphan sweep is off, so only the release protocol can save the request. Forced 200 times.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.testing import CheckpointGate, fast_settings, running_daemon
from tests.support.apps import RecordingApp

ITERATIONS = 200


async def test_request_published_during_release_is_never_stranded(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, quiescent_period=0.02)
    gate = CheckpointGate("stopped_consuming")
    gate.release()  # not armed until the loop arms it
    js = nc.jetstream()
    async with running_daemon(nc, settings, RecordingApp(), hooks=gate, sweep=False) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        for i in range(ITERATIONS):
            gate.arm("stopped_consuming" if i % 2 == 0 else "task_acked")
            first = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/i", value=i)], timeout=10
            )
            assert first.ok
            await gate.wait_reached()
            before = (await js.stream_info(settings.subjects.requests_stream)).state.last_seq
            # Inside the window: publish the next request (its task publish is refused while the task exists).
            late = asyncio.create_task(
                client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/late", value=i)], timeout=10)
            )

            async def published(before: int = before) -> bool:
                return (await js.stream_info(settings.subjects.requests_stream)).state.last_seq > before

            await wait_for(published, timeout=5, message="late request durable")
            gate.release()
            assert (await late).ok, f"iteration {i}: late request not processed"
            # The activation that served `late` must be gone before the gate is armed again: armed early, the gate
            # would pause *its* release, with the next iteration's first request waiting behind it for a reply
            # that needs the gate released (the test would deadlock with itself).
            await wait_for(
                lambda: not daemon.owned, timeout=10, message=f"iteration {i}: change set released"
            )
        assert daemon.stats.requests_applied == 2 * ITERATIONS
