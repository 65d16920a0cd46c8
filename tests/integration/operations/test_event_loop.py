"""``event_loop``: the daemon process runs on the event loop its settings name, and serves the same on either."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from tests.support.daemons import daemon_processes, spawn_daemon


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_the_daemon_serves_on_the_event_loop_it_is_given(
    nc: NatsClient, nats_url: str, subject_prefix: str, tmp_path: Path, loop: str
) -> None:
    env = {"REBASER_STORAGE": "memory", "REBASER_EVENT_LOOP": loop}
    async with daemon_processes() as procs:
        daemon = await spawn_daemon(nats_url, subject_prefix, tmp_path, env, "d")
        procs.append(daemon)
        assert f"{loop} event loop".encode() in daemon.log.read_bytes()
        client = RebaserClient(nc, prefix=subject_prefix)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        for value in range(3):
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/n", value=value)], timeout=20
            )
            assert reply.ok, reply
        daemon.proc.send_signal(signal.SIGTERM)
        assert await daemon.wait(30) == 0  # a clean stop: the signal handlers work on this loop too
