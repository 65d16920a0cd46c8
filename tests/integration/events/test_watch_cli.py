"""``rebaser watch``: a line per event, live, as JSON or for people; Ctrl-C ends it cleanly. And a follower that never
reads holds nobody up."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, RebaserUnavailable, SetLiteral
from rebaser_client.admin.cli.watch import event_line
from rebaser_core.api import ChangeSetEvent
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp


def _inherit_an_ignored_sigint() -> None:
    # As a parent that ignores SIGINT leaves it (pytest-xdist's workers may): Python then installs no handler for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


async def _watch(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from rebaser_client.admin.cli.main import main; main()",
        "watch",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ),
        preexec_fn=_inherit_an_ignored_sigint,
    )


async def _lines(proc: asyncio.subprocess.Process, wanted: int, keep: str) -> list[str]:
    """The first ``wanted`` lines of the watch's output that contain ``keep``."""
    assert proc.stdout is not None
    found: list[str] = []
    async with asyncio.timeout(30):
        while len(found) < wanted:
            line = (await proc.stdout.readline()).decode()
            assert line, f"the watch ended early: {(await proc.stderr.read()).decode()[-2000:]}"  # type: ignore[union-attr]
            if keep in line:
                found.append(line.rstrip("\n"))
    return found


async def _interrupt(proc: asyncio.subprocess.Process) -> int:
    proc.send_signal(signal.SIGINT)
    async with asyncio.timeout(30):
        return await proc.wait()


async def test_watch_prints_each_event_as_json_and_stops_on_ctrl_c(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        sent = [await client.enqueue_updates(wk, cs, [SetLiteral(path="/a", value=n)]) for n in range(3)]
        await client.wait_settled(wk, cs, timeout=20)
        proc = await _watch(
            str(wk), str(cs), "--since", "0", "--json", "--nats-url", nats_url, "--prefix", subject_prefix
        )
        try:
            lines = await _lines(proc, 3, '"durable":true')
        finally:
            code = await _interrupt(proc)
        events = [ChangeSetEvent.model_validate(json.loads(line), strict=False) for line in lines]
        assert [e.request_id for e in events] == sent
        assert code == 0


async def test_watch_of_a_workspace_prints_lines_for_people(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        proc = await _watch(str(wk), "--nats-url", nats_url, "--prefix", subject_prefix)
        try:
            # Live only: the watch is subscribed once it answers; a request sent until a line comes is seen.
            async def send_until_seen() -> list[str]:
                seen = asyncio.create_task(_lines(proc, 1, " applied "))
                while not seen.done():
                    await client.enqueue_updates_with_reply(
                        wk, cs, [SetLiteral(path="/a", value=1)], timeout=20
                    )
                    await asyncio.wait({seen}, timeout=0.5)  # a pace for the sends, not a wait for a result
                return seen.result()

            (line,) = await send_until_seen()
        finally:
            await _interrupt(proc)
        assert str(cs) in line and "request " in line and "1 updates" in line


async def test_a_follower_that_never_reads_holds_nobody_up(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        # Subscribed and never read: the server stops pushing to it (flow control), the daemon only publishes.
        async with client.watch(wk, cs, since=0):
            replies = await asyncio.gather(
                *(
                    client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=n)], timeout=90)
                    for n in range(1200)  # more events than the follower may hold unread (1,024)
                )
            )
        assert all(r.ok for r in replies)


async def test_following_a_deployment_without_the_feed_says_what_to_turn_on(client: RebaserClient) -> None:
    # No daemon has published with the feed on under this prefix: there is no events stream to follow.
    with pytest.raises(RebaserUnavailable) as raised:
        async with client.watch(WorkspacePk.new(), feed="stream"):
            pass
    message = str(raised.value)
    assert "REBASER_EVENTS=true" in message and "NotFoundError" not in message, message


async def test_following_a_deployment_no_daemon_started_says_so(client: RebaserClient) -> None:
    # No daemon has started under this prefix: there are no records, so no record feed, to follow.
    with pytest.raises(RebaserUnavailable) as raised:
        async with client.watch(WorkspacePk.new()):
            pass
    message = str(raised.value)
    assert "has a daemon started here?" in message and "NotFoundError" not in message, message


def test_a_line_for_people_names_what_happened() -> None:
    wk, cs, rid = WorkspacePk.new(), ChangeSetId.new(), RequestId.new()
    applied = ChangeSetEvent(
        id=RequestId.new(),
        workspace_id=wk,
        change_set_id=cs,
        kind="dead_lettered",
        seq=7,
        durable=True,
        at=0.0,
        request_id=rid,
        status="error",
        reason="max_attempts",
    )
    line = event_line(applied, workspace=True)
    assert line.startswith("00:00:00.000 ")
    assert str(cs) in line and "#7" in line and "dead_lettered" in line and f"request {rid}" in line
    assert "reason max_attempts" in line
    notice = ChangeSetEvent(
        id=RequestId.new(),
        workspace_id=wk,
        change_set_id=cs,
        kind="taken",
        seq=7,
        durable=False,
        at=0.0,
        owner="d1",
        epoch=3,
    )
    assert "(after #7)" in event_line(notice, workspace=False) and "owner d1 epoch 3" in event_line(
        notice, workspace=False
    )
