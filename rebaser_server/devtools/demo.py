"""Demo traffic for ``rebaser-server --demo`` (``make run``): watch change sets being rebased and recomputed.

A workspace's HEAD describes a tiny system; three change sets are forked from it and updated concurrently (some
batches computed against stale versions, so they conflict); dependent values are recomputed as updates land; two
change sets are applied onto HEAD (the second one conflicts where both changed the same attribute).
"""

from __future__ import annotations

import asyncio
import time

import click
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient
from rebaser_core.api import EnqueueUpdatesResponse, SetFunction, SetLiteral, Update
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_server.daemon.daemon import Daemon

FEATURES = ("feature-a", "feature-b", "feature-c")
BATCHES_PER_FEATURE = 40

HEAD_SETUP: list[Update] = [
    SetLiteral(path="/web/host", value="web.internal"),
    SetLiteral(path="/web/port", value=8080),
    SetLiteral(path="/web/replicas", value=2),
    SetLiteral(path="/db/replicas", value=1),
    SetLiteral(path="/templates/url", value="http://{}:{}"),
    SetFunction(path="/web/url", function="format", args=["/templates/url", "/web/host", "/web/port"]),
    SetFunction(path="/fleet/replicas", function="sum", args=["/web/replicas", "/db/replicas"]),
    SetFunction(path="/fleet/largest", function="max", args=["/web/replicas", "/db/replicas"]),
]


class _Tally:
    """The demo's own requests, counted from their replies: the daemon's counters would also count whatever an
    earlier run left in the store (a change set handed back at exit is taken again at the next start)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.started = time.monotonic()
        self.replies = 0
        self.applied = 0  # success replies: a request with conflicts has nothing of it applied
        self.conflicts = 0
        self.errors = 0
        self.dvu_runs_before = daemon.stats.dvu_runs

    def count(self, response: EnqueueUpdatesResponse) -> None:
        self.replies += 1
        self.applied += response.status.kind == "success"
        self.conflicts += response.status.kind == "conflicts"
        self.errors += response.status.kind == "error"
        if self.replies % 20 == 0:
            self.line()

    @property
    def dvu_runs(self) -> int:
        return self.daemon.stats.dvu_runs - self.dvu_runs_before

    def line(self) -> None:
        click.echo(
            f"  [{time.monotonic() - self.started:5.1f}s] replies={self.replies:3d} applied={self.applied:3d} "
            f"conflicts={self.conflicts:2d} dvu runs={self.dvu_runs:3d} owned change sets={len(self.daemon.owned)}"
        )


async def _feature_traffic(
    client: RebaserClient, tally: _Tally, wk: WorkspacePk, cs: ChangeSetId, index: int
) -> None:
    for n in range(BATCHES_PER_FEATURE):
        port = await client.get_change_set(wk, cs, "/web/port")
        version = port.versions.get("/web/port")
        if n % 9 == 4:
            version = "stale-version"  # as if computed long ago: the whole batch conflicts
        updates: list[Update] = [
            SetLiteral(path="/web/port", value=9000 + 100 * index + n, expected_version=version)
        ]
        if n % 4 == 0:
            updates.append(SetLiteral(path="/web/replicas", value=2 + (n + index) % 5))
        tally.count(await client.enqueue_updates_with_reply(wk, cs, updates, timeout=30))


async def run_demo(nc: NatsClient, settings: Settings, daemon: Daemon) -> None:
    tally = _Tally(daemon)
    wk, head = WorkspacePk.new(), ChangeSetId.new()
    async with RebaserClient(nc, prefix=settings.prefix) as client:
        click.echo(f"workspace {wk}: HEAD {head} gets {len(HEAD_SETUP)} attributes, 3 of them computed")
        tally.count(await client.enqueue_updates_with_reply(wk, head, HEAD_SETUP))
        features = {name: ChangeSetId.new() for name in FEATURES}
        for name, cs in features.items():
            await client.fork_change_set(wk, cs, head)
            click.echo(f"forked {name} ({cs}) from HEAD")
        click.echo(
            f"sending {BATCHES_PER_FEATURE} update batches to each, concurrently, each awaiting its reply:"
        )
        await asyncio.gather(
            *(_feature_traffic(client, tally, wk, cs, i) for i, cs in enumerate(features.values()))
        )
        tally.line()
        for name in ("feature-a", "feature-b"):
            response = await client.enqueue_updates_from_change_set_with_reply(wk, head, features[name])
            tally.count(response)
            if response.status.kind == "conflicts":
                paths = ", ".join(c.path for c in response.status.conflicts)
                click.echo(
                    f"applying {name} onto HEAD: conflicts on {paths} (HEAD changed them since the fork)"
                )
            else:
                click.echo(f"applying {name} onto HEAD: {response.status.kind}")
        while (state := await client.get_change_set(wk, head)).dvu_pending:  # noqa: ASYNC110 - polling a view
            await asyncio.sleep(0.05)
    click.echo(f"HEAD now (snapshot {state.snapshot_address and state.snapshot_address[:12]}):")
    for path, value in sorted(state.values.items()):
        click.echo(f"  {path} = {value!r}")
    click.echo(
        f"summary: {tally.replies} requests: {tally.applied} applied, {tally.conflicts} with conflicts "
        f"(nothing of them applied), {tally.errors} errors; {tally.dvu_runs} DVU runs, "
        f"{time.monotonic() - tally.started:.1f}s"
    )
