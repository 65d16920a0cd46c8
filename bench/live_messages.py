"""How many received NATS messages a daemon keeps alive under steady load, and what holds a sample of them.

A diagnostic for the soak (bench/soak.py): ``--tracemalloc`` points at nats-py's message objects among what grows,
but tracemalloc slows the daemon down several times, so a backlog can look like a leak. This counts them directly,
without tracemalloc: a daemon in this process (the snapshot app, memory storage) on an embedded nats-server,
``--clients`` callers each sending one awaited request after another to ``--change-sets`` change sets, and every
``--sample`` seconds the number of live ``nats.aio.msg.Msg`` objects of the daemon's connection (one full garbage
collection each: the daemon pauses for it). At the end, what refers to a sample of them, two levels up.

    .venv/bin/python -m bench.live_messages --seconds 100 --change-sets 500
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.testing import running_daemon


def live_messages(nc: Any) -> list[Msg]:
    return [o for o in gc.get_objects() if isinstance(o, Msg) and o._client is nc]


def _describe(o: object) -> str:
    if isinstance(o, dict | list | tuple | set | collections.deque):
        return f"{type(o).__name__}(len={len(o)})"
    return type(o).__name__


def holders(messages: list[Msg], sample: int = 40) -> list[tuple[int, str]]:
    """What refers to ``sample`` of ``messages``, and what refers to that: the commonest chains first."""
    chains: collections.Counter[str] = collections.Counter()
    for msg in random.sample(messages, min(sample, len(messages))):
        for ref in gc.get_referrers(msg):
            if ref is messages:
                continue
            outer = [_describe(r) for r in gc.get_referrers(ref) if r is not messages][:3]
            chains[f"{_describe(ref)} <- {', '.join(outer)}"] += 1
    return [(n, chain) for chain, n in chains.most_common(10)]


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as store:
        server = NatsServer(store_dir=Path(store) / "nats")
        await asyncio.to_thread(server.start)
        try:
            daemon_nc = await nats.connect(server.url)
            client_nc = await nats.connect(server.url)
            settings = Settings(prefix="live", storage="memory")
            async with running_daemon(daemon_nc, settings, SnapshotApp()):
                client = RebaserClient(client_nc, prefix="live")
                pool = [(WorkspacePk.new(), ChangeSetId.new()) for _ in range(args.change_sets)]
                stop = time.monotonic() + args.seconds
                sent = 0

                async def caller() -> None:
                    nonlocal sent
                    rng = random.Random()
                    while time.monotonic() < stop:
                        wk, cs = pool[rng.randrange(len(pool))]
                        update = SetLiteral(path=f"/k{sent % 5}", value=sent)
                        await client.enqueue_updates_with_reply(wk, cs, [update], timeout=30)
                        sent += 1

                callers = [asyncio.create_task(caller()) for _ in range(args.clients)]
                while time.monotonic() < stop:
                    await asyncio.sleep(min(args.sample, max(0.0, stop - time.monotonic())))
                    gc.collect()
                    print(f"{sent:>9} requests  {len(live_messages(daemon_nc)):>7} live messages", flush=True)
                await asyncio.gather(*callers)
                gc.collect()
                messages = live_messages(daemon_nc)
                kinds = collections.Counter(".".join(m.subject.split(".")[1:3]) for m in messages)
                print(f"at the end: {len(messages)} live messages, by subject: {kinds.most_common(5)}")
                for n, chain in holders(messages):
                    print(f"  {n:>3}  {chain}")
            await client_nc.close()
            await daemon_nc.close()
        finally:
            await asyncio.to_thread(server.stop)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=100.0)
    parser.add_argument("--change-sets", type=int, default=500)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--sample", type=float, default=20.0, help="seconds between counts")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
