"""``rebaser status`` per workspace, against a real nats-server and a running daemon: how many change sets each of
the busiest workspaces has owned (as the daemons' /status says) and waiting (tasks in the tasks stream no daemon
owns), in the JSON and in the table; unknown when no daemon is read, and a daemon that cannot be read is said."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from click.testing import CliRunner, Result
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_client.admin.cli.main import main as cli
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.ops.http import HealthServer
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import GatedApp


async def rebaser(nats_url: str, prefix: str, *args: str) -> Result:
    argv = [*args, "--nats-url", nats_url, "--prefix", prefix]
    return await asyncio.to_thread(CliRunner().invoke, cli, argv, catch_exceptions=False)


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


async def test_status_shows_each_busy_workspace_owned_and_waiting(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str
) -> None:
    # Two slots, both taken by the big workspace's requests held at the gate: its other change sets and the small
    # workspace's one wait in the tasks stream (nothing owned is idle, so nothing gives way).
    settings = fast_settings(subject_prefix, concurrency=2, quiescent_period=300, handler_deadline=120)
    app = GatedApp()
    async with running_daemon(nc, settings, app) as daemon:
        server = HealthServer(daemon, port=0)
        await server.start()
        big, small = WorkspacePk.new(), WorkspacePk.new()
        try:
            for _ in range(5):
                await client.enqueue_updates(big, ChangeSetId.new(), [SetLiteral(path="/gate", value=1)])
            await wait_for(
                lambda: app.held == 2, timeout=20, message="two of the big workspace's requests held"
            )
            await client.enqueue_updates(small, ChangeSetId.new(), [SetLiteral(path="/n", value=1)])
            expected = [
                {"workspace_id": str(big), "owned": 2, "waiting": 3, "tasks": 5, "queued": 5, "served": 1.0},
                {
                    "workspace_id": str(small),
                    "owned": 0,
                    "waiting": 1,
                    "tasks": 1,
                    "queued": 1,
                    "served": 0.0,
                },
            ]

            async def as_expected() -> dict[str, Any] | None:
                status = ok_json(
                    await rebaser(nats_url, subject_prefix, "status", "--json", "--daemon-url", server.url)
                )
                return status if status["workspaces"] == expected else None

            status = await wait_for(as_expected, timeout=20, message="both workspaces as expected")
            assert status["workspaces_total"] == 2 and status["daemons_read"] == 1
            assert status["daemon_problems"] == []

            table = await rebaser(nats_url, subject_prefix, "status", "--daemon-url", server.url)
            assert table.exit_code == 0, table.output
            assert (
                "workspaces with work: 2" in table.output and "owned: as 1 daemons read say" in table.output
            )
            workspaces = table.output.split("workspaces with work:")[1]
            row = next(line for line in workspaces.splitlines() if str(big) in line)
            assert [cell.strip() for cell in row.split("│")[2:6]] == ["2", "3", "5", "5"]

            # No daemon read: owned and waiting unknown, the streams' figures still there.
            unread = ok_json(await rebaser(nats_url, subject_prefix, "status", "--json"))
            assert [(w["owned"], w["waiting"], w["tasks"]) for w in unread["workspaces"]] == [
                (None, None, 5),
                (None, None, 1),
            ]
            assert unread["daemons_read"] == 0
            # A daemon that does not answer is said, in one line, and counts as not read.
            bad = ok_json(
                await rebaser(
                    nats_url, subject_prefix, "status", "--json", "--daemon-url", "http://127.0.0.1:1"
                )
            )
            assert bad["daemons_read"] == 0 and len(bad["daemon_problems"]) == 1
            assert "127.0.0.1:1/status" in bad["daemon_problems"][0]
        finally:
            app.gate.set()
            await server.stop()


async def test_status_names_the_lease_mode(nats_url: str, nc: NatsClient, subject_prefix: str) -> None:
    # lease_mode daemon keeps one heartbeat key per daemon; task mode has no such bucket.
    for mode, heartbeats, said in (
        ("task", None, "lease_mode task"),
        ("daemon", 1, "lease_mode daemon, 1 daemon"),
    ):
        prefix = f"{subject_prefix}{mode}"
        async with running_daemon(nc, fast_settings(prefix, lease_mode=mode), GatedApp()):
            assert (
                ok_json(await rebaser(nats_url, prefix, "status", "--json"))["lease_heartbeats"] == heartbeats
            )
            table = await rebaser(nats_url, prefix, "status")
            assert table.exit_code == 0 and said in table.output, table.output
