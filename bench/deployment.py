"""One implementation under test on a fresh subject prefix: the daemons (or hand-written workers) as subprocesses,
and how to send one request to them and read what JetStream holds for them."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
from typing import Any, Protocol

import nats.errors
from nats.aio.client import Client

from bench import fair_loop
from bench.baseline import BaselineClient, names, setup_streams
from bench.procs import Processes
from rebaser_client import RebaserClient
from rebaser_core.api import SetLiteral, SuccessStatus
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.subjects import Subjects

# "rebaser" measures the framework (the spine) with the smallest app, the yardstick for the baseline ratio;
# "snapshots" runs the default application (object-store snapshots, DVU) to show the cost of real work.
# "rebaser" has the change-set event feed on, as by default (the window each record write carries); "nofeed" is
# "rebaser" with it off (REBASER_EVENTS_WINDOW=0): the feed's cost is the ratio of the two. "stream" is "rebaser"
# with the events stream published too (REBASER_EVENTS=true, off by default). "uvloop" is "rebaser" on uvloop
# (REBASER_EVENT_LOOP=uvloop); "leases" is "rebaser" with one heartbeat per daemon instead of a lease renewal per
# change set (REBASER_LEASE_MODE=daemon).
APPS = {
    "rebaser": "rebaser_server.apps.counter:CounterApp",
    "nofeed": "rebaser_server.apps.counter:CounterApp",
    "stream": "rebaser_server.apps.counter:CounterApp",
    "snapshots": "rebaser_server.apps.snapshots:SnapshotApp",
    "uvloop": "rebaser_server.apps.counter:CounterApp",
    "leases": "rebaser_server.apps.counter:CounterApp",
}
IMPL_ENV = {
    "nofeed": {"REBASER_EVENTS": "false", "REBASER_EVENTS_WINDOW": "0", "REBASER_EVENT_LOOP": "asyncio"},
    "stream": {"REBASER_EVENTS": "true"},
    "rebaser": {"REBASER_EVENTS": "false", "REBASER_EVENT_LOOP": "asyncio"},
    "uvloop": {"REBASER_EVENTS": "false", "REBASER_EVENT_LOOP": "uvloop"},
    # ack_wait 2 s: a peer notices a silent daemon within ack_wait plus its look every progress_period (0.5 s), so a
    # dead daemon's change sets wait as long as with the default lease_mode's ack_wait of 2.5 s.
    "leases": {"REBASER_EVENTS": "false", "REBASER_LEASE_MODE": "daemon", "REBASER_ACK_WAIT": "2"},
}
# The hand-written loops (bench/baseline.py): "baseline" the plain one, "fair" the one on the daemon's lease that
# commits a record per request (bench/fair_loop.py).
LOOPS = ("baseline", "fair")


class Harness(Protocol):
    """What a deployment uses of the run that holds it (``bench.bench.Bench``): its server, processes and knobs."""

    args: argparse.Namespace
    server: NatsServer
    procs: Processes
    env: dict[str, str]
    wrap: list[str]
    ready_timeout: float
    workspace: WorkspacePk

    def next_index(self) -> int: ...


class Deployment:
    """One implementation's daemons or workers on a fresh prefix, and a function sending one request."""

    def __init__(self, bench: Harness, impl: str, daemons: int, app: str | None = None) -> None:
        self.bench, self.impl, self.daemons = bench, impl, daemons
        self.app = app or APPS.get(impl, "")
        self.prefix = f"b{bench.next_index()}{impl[0]}{secrets.token_hex(3)}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.client: RebaserClient | None = None
        self.base: BaselineClient | None = None

    async def start(self, nc: Client, env: dict[str, str] | None = None) -> None:
        bench = self.bench
        if self.impl in LOOPS:
            if self.impl == "fair":
                await fair_loop.setup(nc.jetstream(), self.prefix)
            else:
                await setup_streams(nc.jetstream(), self.prefix)
            args = [
                sys.executable,
                "-m",
                f"bench.{'fair_loop' if self.impl == 'fair' else 'baseline'}",
                "--url",
                bench.server.url,
                "--prefix",
                self.prefix,
            ]
            args += ["--quiet", str((env or {}).get("REBASER_QUIESCENT_PERIOD", bench.args.quiescent))]
            marker = "baseline worker ready"
        else:
            args = [sys.executable, "-m", "rebaser_server", "--nats-url", bench.server.url]
            # No health endpoint: several daemons share this host, and a taken health port is an error.
            args += [
                "--prefix",
                self.prefix,
                "--app",
                self.app,
                "--log-level",
                "WARNING",
                "--http-port",
                "-1",
            ]
            marker = "rebaser daemon serving"
        await self.attach(nc)
        full_env = {**bench.env, **IMPL_ENV.get(self.impl, {}), **(env or {})}
        args = [*bench.wrap, *args]
        self.procs = [bench.procs.spawn(f"{self.prefix}-{i}", args, full_env) for i in range(self.daemons)]
        for proc in self.procs:
            await bench.procs.wait_ready(proc, marker, timeout=bench.ready_timeout)

    async def attach(self, nc: Client) -> None:
        """The client side on ``nc``: what :meth:`send` uses (``start`` calls it; bench/instructions.py's client
        process calls it alone, for daemons another process started)."""
        if self.impl in LOOPS:
            self.base = BaselineClient(nc, self.prefix)
            await self.base.start()
        else:
            self.client = RebaserClient(nc, prefix=self.prefix, max_in_flight=self.bench.args.max_in_flight)

    async def send(self, cs: ChangeSetId, i: int) -> bool:
        timeout = self.bench.args.timeout
        if self.base is not None:
            reply = await self.base.call(str(cs), i, timeout)
            return bool(reply["ok"]) and reply["value"] == i
        assert self.client is not None
        updates = [SetLiteral(path="/n", value=i)]
        answer = await self.client.enqueue_updates_with_reply(
            self.bench.workspace, cs, updates, timeout=timeout
        )
        return isinstance(answer.status, SuccessStatus)

    def pids(self) -> dict[str, list[int]]:
        return {
            "nats-server": [self.bench.server.pid or 0],
            "daemons": [p.pid for p in self.procs],
            "client": [os.getpid()],
        }

    @property
    def streams(self) -> tuple[str, str, str]:
        """(requests stream, tasks stream, tasks consumer)."""
        if self.impl in LOOPS:
            n = names(self.prefix)
            return n["requests_stream"], n["tasks_stream"], "tasks"
        s = Subjects(self.prefix)
        return s.requests_stream, s.tasks_stream, s.tasks_consumer

    async def activations(self, nc: Client) -> int:
        """Task deliveries so far, over every consumer of the tasks stream (the shared one, the lanes', or the
        workspaces': whatever the intake); -1 if none could be read."""
        _, stream, consumer = self.streams
        js = nc.jetstream()
        try:
            if self.impl in LOOPS:
                info = await js.consumer_info(stream, consumer)
                return int(info.delivered.consumer_seq or 0) if info.delivered else -1
            infos: list[Any] = []
            while True:
                page = await js.consumers_info(stream, offset=len(infos))
                infos += page
                if len(page) < 256:
                    break
        except Exception:
            return -1
        if not infos:
            return -1
        return sum(int(info.delivered.consumer_seq or 0) for info in infos if info.delivered)

    async def drained(self, nc: Client, timeout: float) -> bool:
        """Wait until every processed request has been removed from the requests stream (False: not in time)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                if (await nc.jetstream().stream_info(self.streams[0])).state.messages == 0:
                    return True
            await asyncio.sleep(0.05)
        return False

    async def consumers(self, nc: Client) -> int:
        """Consumers of the requests stream; -1 if the server did not answer in time (busy: ask again)."""
        try:
            info = await nc.jetstream().stream_info(self.streams[0])
        except nats.errors.TimeoutError:
            return -1
        return int(info.state.consumer_count)

    async def stop(self, nc: Client) -> None:
        for proc in self.procs:
            await self.bench.procs.stop(proc)
        if self.base is not None:
            await self.base.stop()
        js = nc.jetstream()
        with contextlib.suppress(Exception):
            for info in await js.streams_info():
                name = info.config.name or ""
                if name.startswith((f"{self.prefix}_", f"KV_{self.prefix}_", f"OBJ_{self.prefix}_")):
                    await js.delete_stream(name)
