"""Demo traffic for ``rebaser-server --demo``: a newcomer watches change sets being updated in order."""

from __future__ import annotations

import asyncio
import time

import click
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient
from rebaser_core.api import SetFunction, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet
from rebaser_server.server import Daemon

CHANGE_SETS = 4
BATCHES_PER_CHANGE_SET = 30


async def run_demo(nc: NatsClient, settings: Settings, daemon: Daemon) -> None:
    workspace = WorkspacePk.new()
    change_sets = [ChangeSetId.new() for _ in range(CHANGE_SETS)]
    done = conflicts = 0
    started = time.monotonic()

    def progress() -> None:
        total = CHANGE_SETS * BATCHES_PER_CHANGE_SET
        click.echo(
            f"[{time.monotonic() - started:5.1f}s] {done:3d}/{total} replies  conflicts={conflicts:2d}  "
            f"dvu runs={daemon.stats.dvu_runs:3d}  owned change sets={len(daemon.owned)}"
        )

    async def drive(client: RebaserClient, index: int, change_set: ChangeSetId) -> None:
        nonlocal done, conflicts
        for n in range(BATCHES_PER_CHANGE_SET):
            updates: list[SetLiteral | SetFunction] = [SetLiteral(path="/web/port", value=8000 + n)]
            if n == 0:
                updates += [
                    SetLiteral(path="/web/host", value=f"web-{index}.local"),
                    SetFunction(path="/web/url", function="concat", args=["/web/host", "/web/port"]),
                    SetFunction(path="/stats/total", function="sum", args=["/web/port", "/web/replicas"]),
                ]
            if n % 7 == 3:  # computed against a stale version: the whole batch is refused as a conflict
                updates = [SetLiteral(path="/web/replicas", value=n, expected_version="0")]
            elif n % 5 == 0:
                updates.append(SetLiteral(path="/web/replicas", value=n % 3 + 1))
            response = await client.enqueue_updates_with_reply(workspace, change_set, updates, timeout=30)
            done += 1
            conflicts += response.status.kind == "conflicts"
            if done % 20 == 0:
                progress()

    click.echo(
        f"demo: workspace {workspace}, {CHANGE_SETS} change sets, "
        f"{BATCHES_PER_CHANGE_SET} update batches each, every one awaiting its reply"
    )
    async with RebaserClient(nc, prefix=settings.prefix) as client:
        await asyncio.gather(*(drive(client, i, cs) for i, cs in enumerate(change_sets)))
    click.echo("waiting for the change sets to go quiet and be released ...")
    while daemon.owned:  # noqa: ASYNC110 - a progress display polls; nothing to wait on here
        await asyncio.sleep(0.2)
    for change_set in change_sets:
        record = await daemon.rt.store.read(ChangeSet(workspace, change_set))
        values = record.state["values"] if record else {}
        click.echo(
            f"  change set {change_set}: " + ", ".join(f"{k}={v!r}" for k, v in sorted(values.items()))
        )
    elapsed = time.monotonic() - started
    s = daemon.stats
    click.echo(
        f"summary: {s.requests_applied} requests applied, {conflicts} conflicts, {s.dvu_runs} DVU runs "
        f"(coalesced from {s.requests_applied} notifications at most), {s.tasks_taken} tasks taken, "
        f"{s.tasks_released} released, {elapsed:.1f}s"
    )
