"""The daemon's health endpoint over real HTTP: /healthz, /readyz flipping under back-pressure and recovering,
/status with the backlog, the JetStream facts cached, and the ``rebaser-server --http-port`` wiring."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_client.admin.status import status_report
from rebaser_client.admin.streams import show_layout
from rebaser_core.api import EnqueueUpdatesRequest
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.app import Applied, AppState, ChangeSet
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.ops.http import HealthServer
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp

ROOT = Path(__file__).resolve().parents[3]


class GatedApp(RecordingApp):
    """Every apply waits for ``gate``: requests pile up in the stream until the test opens it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        await self.gate.wait()
        return await super().apply(change_set, state, request)


@asynccontextmanager
async def health_server(daemon: Daemon) -> AsyncIterator[str]:
    server = HealthServer(daemon, port=0)
    await server.start()
    try:
        yield server.url
    finally:
        await server.stop()


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as response:
        return response.status, await response.json()


async def test_readiness_flips_under_backpressure_and_recovers(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # The fifo intake: its shared consumer tells waiting from owned tasks (tasks_waiting, tasks_unacked).
    settings = fast_settings(subject_prefix, ready_max_backlog=5, concurrency=1, intake="fifo")
    app = GatedApp()
    async with (
        running_daemon(nc, settings, app) as daemon,
        health_server(daemon) as url,
        aiohttp.ClientSession() as http,
    ):
        assert await get(http, f"{url}/healthz") == (200, {"alive": True})
        assert await get(http, f"{url}/readyz") == (200, {"ready": True, "not_ready": []})

        wk, change_sets = WorkspacePk.new(), [ChangeSetId.new() for _ in range(3)]
        for i in range(9):
            await client.enqueue_updates(wk, change_sets[i % 3], [SetLiteral(path="/n", value=i)])

        async def not_ready() -> Any:
            code, body = await get(http, f"{url}/readyz")
            return code == 503 and body

        body = await wait_for(not_ready, timeout=5, message="/readyz 503 under back-pressure")
        assert body["ready"] is False and "9 requests waiting (ready_max_backlog 5)" in body["not_ready"]

        async def settled() -> Any:
            code, status = await get(http, f"{url}/status")
            facts = status["jetstream"]
            return code == 200 and facts["tasks_waiting"] == 2 and facts["tasks_unacked"] == 1 and status

        status = await wait_for(settled, timeout=5, message="one change set owned, two waiting")
        assert status["owned"]["count"] == 1 and status["owned"]["concurrency"] == 1
        assert status["jetstream"]["requests_waiting"] == 9 and status["jetstream"]["dead_letters"] == 0
        assert status["nats"]["state"] == "connected" and status["alive"] is True
        assert status["last_request_at"] is None and status["stats"]["tasks_taken"] == 1

        app.gate.set()

        async def ready() -> bool:
            return (await get(http, f"{url}/readyz"))[0] == 200

        await wait_for(ready, timeout=15, message="/readyz 200 once the backlog drained")
        _, status = await get(http, f"{url}/status")
        assert status["last_request_at"] is not None and status["last_publish_at"] is not None
        assert status["stats"]["requests_applied"] >= 5


async def test_status_is_cached_and_shutdown_is_not_ready(nc: NatsClient, subject_prefix: str) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon:
        first, second = await asyncio.gather(daemon.status(), daemon.status())
        third = await daemon.status()
        checked = {s["jetstream"]["checked_at"] for s in (first, second, third)}
        assert len(checked) == 1  # one JetStream fetch served all three
        async with health_server(daemon) as url, aiohttp.ClientSession() as http:
            shutdown = asyncio.create_task(daemon.shutdown())

            async def stopping_answer() -> tuple[int, Any] | None:
                answer = await get(http, f"{url}/readyz")
                return answer if answer[0] == 503 else None

            _, body = await wait_for(stopping_answer, timeout=5, message="503 while stopping")
            assert "shutting down" in body["not_ready"]
            await shutdown


async def test_missing_stream_is_not_ready(nc: NatsClient, subject_prefix: str) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        await nc.jetstream().delete_stream(settings.subjects.dead_letter_stream)

        async def missing() -> Any:
            status = await daemon.status()
            return not status["ready"] and status["not_ready"]

        reasons = await wait_for(missing, timeout=5, message="a missing stream is reported")
        assert any(settings.subjects.dead_letter_stream in r for r in reasons)


async def test_cli_serves_the_health_endpoint(nats_url: str, subject_prefix: str, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rebaser_server",
            "--nats-url",
            nats_url,
            "--prefix",
            subject_prefix,
            "--app",
            "tests.support.apps:RecordingApp",
            "--http-port",
            "0",
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "REBASER_STORAGE": "memory"},
            cwd=str(ROOT),
        )
    try:

        def health_url() -> str | None:
            found = re.search(rb"health endpoint on (http://\S+)", log.read_bytes())
            return found.group(1).decode() if found else None

        url = await wait_for(health_url, timeout=20, message="the daemon printed its health endpoint")
        async with aiohttp.ClientSession() as http:
            assert await get(http, f"{url}/healthz") == (200, {"alive": True})
            code, status = await get(http, f"{url}/status")
            assert code == 200 and status["prefix"] == subject_prefix
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0, log.read_text()


async def test_with_the_lanes_tasks_waiting_and_owned_are_counted_everywhere(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    # The lanes intake (a new deployment's) has no shared consumer: each shard's lanes are added up, for /status,
    # /metrics, `rebaser status` and `rebaser streams show`, which operators scale and alert on (docs/operations.md).
    settings = fast_settings(subject_prefix, concurrency=1)
    app = GatedApp()
    async with (
        running_daemon(nc, settings, app) as daemon,
        health_server(daemon) as url,
        aiohttp.ClientSession() as http,
    ):
        assert daemon.layout.intake == "lanes"
        wk = WorkspacePk.new()
        for cs in [ChangeSetId.new() for _ in range(3)]:
            await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=1)])

        async def settled() -> Any:
            code, status = await get(http, f"{url}/status")
            facts = status["jetstream"]
            return code == 200 and facts["tasks_waiting"] == 2 and facts["tasks_unacked"] == 1 and status

        await wait_for(
            settled, timeout=10, message="one change set owned, two waiting, counted over the lanes"
        )
        async with http.get(f"{url}/metrics") as response:
            metrics = await response.text()
        assert re.search(r"^rebaser_tasks_waiting 2(\.0)?$", metrics, re.MULTILINE), metrics
        assert re.search(r"^rebaser_tasks_unacked 1(\.0)?$", metrics, re.MULTILINE), metrics
        report = await status_report(nc, settings.subjects)
        assert report.tasks_consumer is not None
        assert report.tasks_consumer["pending"] == 2 and report.tasks_consumer["ack_pending"] == 1
        shown = await show_layout(nc, settings.subjects)
        assert [(s["tasks_waiting"], s["tasks_unacked"]) for s in shown["shards"]] == [(2, 1)]
        app.gate.set()
