"""What nats-server spends per event stored, one at a time or in JetStream atomic batches (the event feed's choices:
rebaser_server.changeset.event_pump).

    .venv/bin/python -m bench.event_batches [--events 20000] [--subjects 200]

Each of ``--subjects`` change sets' subjects gets its events one publication after the other (the next sent when
the last is acknowledged), the subjects side by side, as the feed publishes them. Printed per form: the server's CPU
time per event (from /proc) and the events stored per second. Forms: one event alone, with
``Nats-Expected-Last-Subject-Sequence`` (what the feed sends), with ``Nats-Msg-Id`` as well, and atomic batches of
2, 4, 16 and 128 events expecting the subject's last sequence on their first, 40 subjects side by side (nats-server
takes at most 50 atomic batches in flight per stream).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import tempfile
import time
from pathlib import Path

import nats
from nats.js import api

from rebaser_core.embedded import NatsServer

_BODY = os.urandom(180)  # about an event's size
_HEADERS = {
    "X-CONTENT-TYPE": "application/cbor",
    "X-MESSAGE-TYPE": "ChangeSetEvent",
    "X-MESSAGE-VERSION": "1",
}


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(size: int, msg_id: bool, events: int, subjects: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as store, NatsServer(store_dir=Path(store)) as server:
        nc = await nats.connect(server.url)
        try:
            await nc.jetstream().add_stream(
                api.StreamConfig(name="EV", subjects=["ev.>"], allow_atomic=True, max_msgs_per_subject=1000)
            )
            last = dict.fromkeys(range(subjects), 0)
            assert server.pid is not None
            cpu, start = _cpu_seconds(server.pid), time.monotonic()

            async def publish(lane: int, n: int) -> None:
                subject, batch = f"ev.{lane}", secrets.token_hex(12) if size > 1 else ""
                for i in range(size):
                    headers = dict(_HEADERS)
                    if i == 0:
                        headers["Nats-Expected-Last-Subject-Sequence"] = str(last[lane])
                    if batch:
                        headers |= {"Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(i + 1)}
                    elif msg_id:
                        headers["Nats-Msg-Id"] = f"ev.{lane}.{n}"
                    if i < size - 1:
                        await nc.publish(subject, _BODY, headers=headers)
                        continue
                    if batch:
                        headers["Nats-Batch-Commit"] = "1"
                    ack = json.loads((await nc.request(subject, _BODY, headers=headers, timeout=10)).data)
                    if "error" in ack:
                        raise RuntimeError(ack["error"])
                    last[lane] = ack["seq"]

            async def lane(index: int) -> None:
                for n in range(events // size // subjects):
                    await publish(index, n)

            await asyncio.gather(*(lane(i) for i in range(subjects)))
            stored = events // size // subjects * size * subjects
            return (_cpu_seconds(server.pid) - cpu) / stored * 1e6, stored / (time.monotonic() - start)
        finally:
            await nc.close()


async def main(args: argparse.Namespace) -> None:
    forms = [(1, False, "one event"), (1, True, "one event, with Nats-Msg-Id")]
    forms += [(size, False, f"atomic batches of {size}") for size in (2, 4, 16, 128)]
    print(f"{args.events} events over {args.subjects} subjects, one publication in flight per subject")
    for size, msg_id, label in forms:
        # nats-server takes at most 50 atomic batches in flight per stream (more: "batch is incomplete").
        lanes = min(args.subjects, args.events // size, 40 if size > 1 else args.subjects)
        us, rate = await _measure(size, msg_id, args.events, lanes)
        print(f"  {label:32s} nats-server {us:7.1f} µs CPU per event, {rate:8.0f} events/s", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--subjects", type=int, default=200)
    asyncio.run(main(parser.parse_args()))
