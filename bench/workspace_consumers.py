"""What the fair intake's consumers cost nats-server: one durable consumer per workspace with tasks.

``python -m bench.workspace_consumers [--consumers N] [--step K]`` starts an embedded nats-server (file storage),
makes a work-queue tasks stream as rebaser does, then creates ``N`` workspace consumers one after the other (each a
distinct filter ``rebaser.tasks.<wk>.*.process``, as ``workspace_tasks_consumer_config`` makes them) and prints, for
every ``K`` of them, the time one creation took (the client's round trip: nats-server checks a new filter against
every other consumer's of a work-queue stream) and the server's resident memory per consumer. Then the time a
create of an existing consumer (the same configuration: a no-op) takes at that size, and a no-wait pull of an empty
workspace's consumer (a watched workspace's look).

Single figures move by 10-20 % from run to run on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import nats

from rebaser_core.embedded import NatsServer
from rebaser_core.ids import WorkspacePk
from rebaser_core.nats.streams import ensure_streams, workspace_tasks_consumer_config
from rebaser_core.settings import Settings


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as store:
        server = NatsServer(store_dir=Path(store) / "nats")
        await asyncio.to_thread(server.start)
        try:
            nc = await nats.connect(server.url)
            js = nc.jetstream(timeout=30)
            settings = Settings(prefix="wc")
            await ensure_streams(js, settings, consumer=False)
            stream = settings.subjects.tasks_stream
            pid = server.pid or 0
            rss0 = _rss_kb(pid)
            workspaces = [WorkspacePk.new() for _ in range(args.consumers)]
            print("| consumers | ms per creation (last step) | server memory per consumer, kB |")
            print("|---|---|---|")
            started = time.perf_counter()
            for n, wk in enumerate(workspaces, 1):
                await js.add_consumer(stream, workspace_tasks_consumer_config(settings, wk))
                if n % args.step == 0:
                    now = time.perf_counter()
                    per = (now - started) / args.step * 1000
                    print(f"| {n} | {per:.2f} | {(_rss_kb(pid) - rss0) / n:.0f} |", flush=True)
                    started = now
            sample = workspaces[: min(200, len(workspaces))]
            t = time.perf_counter()
            for wk in sample:
                await js.add_consumer(stream, workspace_tasks_consumer_config(settings, wk))
            again = (time.perf_counter() - t) / len(sample) * 1000
            t = time.perf_counter()
            for wk in sample:
                subject = (
                    f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{settings.subjects.workspace_tasks_consumer(wk)}"
                )
                inbox = nc.new_inbox()
                sub = await nc.subscribe(inbox, max_msgs=1)
                await nc.publish(subject, json.dumps({"batch": 1, "no_wait": True}).encode(), reply=inbox)
                await sub.next_msg(timeout=10)
            look = (time.perf_counter() - t) / len(sample) * 1000
            print(
                f"\ncreate of an existing consumer: {again:.2f} ms; a no-wait look at an empty one: {look:.2f} ms"
            )
            await nc.close()
        finally:
            await asyncio.to_thread(server.stop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--consumers", type=int, default=5000)
    parser.add_argument("--step", type=int, default=1000)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
