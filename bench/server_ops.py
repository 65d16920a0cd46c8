"""nats-server CPU per JetStream operation: what each call of an activation asks of the server.

``python bench/server_ops.py [--count N]`` starts an embedded nats-server (file storage), fills a KV-like stream
(one message per subject), a requests-like stream and a work-queue stream with a durable pull consumer, then runs
``N`` of each operation below, 32 in flight, and prints the server's CPU time (user + system, from ``/proc``) per
operation. The client is one nats-py connection in this process; only the server is measured, so the figures hold
for the daemon and the hand-written loop alike:

- a record read: ``STREAM.MSG.GET`` (the stream leader's answer, JSON with the message in base64) against a direct
  get (``DIRECT.GET``, the message itself);
- a publish with a publish ack, and a compare-and-set one (``Nats-Expected-Last-Subject-Sequence``);
- a request's publish as each side sends it: the hand-written client's (one ``Reply-To`` header) and
  ``RebaserClient``'s (content type, message type, version, reply inbox, ``Nats-Expected-Stream`` and a
  ``Nats-Msg-Id`` the stream remembers for its duplicate window, 120 s); and a task publish that the work queue
  drops as a duplicate (every request after a change set's first);
- a "nothing queued?" check (``STREAM.MSG.GET`` of a subject with no message);
- an ordered push consumer's creation and deletion;
- a confirmed progress ack (``+WPI`` with a reply subject, a lease renewal), a confirmed ``+ACK``, and a delete
  by sequence (``STREAM.MSG.DELETE``).

Single figures move by 10-20 % from run to run on a shared 2-core machine; compare operations within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import nats
from nats.js import api

from bench.procs import cpu_seconds
from rebaser_core import headers as h
from rebaser_core.embedded import NatsServer

_IN_FLIGHT = 32


async def _measure(pid: int, name: str, op: Callable[[int], Awaitable[object]], count: int) -> None:
    limit = asyncio.Semaphore(_IN_FLIGHT)

    async def one(i: int) -> None:
        async with limit:
            await op(i)

    before = cpu_seconds(pid)
    await asyncio.gather(*(one(i) for i in range(count)))
    used = cpu_seconds(pid) - before
    print(f"  {name:<52} {used / count * 1e6:6.0f} µs of nats-server CPU each", flush=True)


async def run(server: NatsServer, count: int) -> None:
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    file = api.StorageType.FILE
    await js.add_stream(
        api.StreamConfig(
            name="KV", subjects=["kv.>"], storage=file, allow_direct=True, max_msgs_per_subject=1
        )
    )
    await js.add_stream(api.StreamConfig(name="RQ", subjects=["rq.>"], storage=file, allow_direct=True))
    await js.add_stream(
        api.StreamConfig(name="RD", subjects=["rd.>"], storage=file, allow_direct=True, duplicate_window=120)
    )
    await js.add_stream(
        api.StreamConfig(name="T", subjects=["t.>"], storage=file, retention=api.RetentionPolicy.WORK_QUEUE)
    )
    for i in range(count):
        await js.publish(f"kv.k{i}", b"r" * 300)
        await nc.publish(f"rq.s{i}", b"q" * 200)
        await nc.publish(f"t.{i}", b"")
    await nc.flush()
    await js.add_consumer(
        "T",
        api.ConsumerConfig(
            durable_name="c", ack_policy=api.AckPolicy.EXPLICIT, ack_wait=600, max_ack_pending=-1
        ),
    )
    puller = await js.pull_subscribe_bind("c", "T")
    tasks = []
    while len(tasks) < count:
        tasks += await puller.fetch(min(1000, count - len(tasks)), timeout=10)

    def get_request(subject: str) -> bytes:
        return json.dumps({"last_by_subj": subject}).encode()

    async def msg_get(i: int) -> None:
        await nc.request("$JS.API.STREAM.MSG.GET.KV", get_request(f"kv.k{i}"), timeout=10)

    async def direct_get(i: int) -> None:
        await nc.request("$JS.API.DIRECT.GET.KV", get_request(f"kv.k{i}"), timeout=10)

    async def nothing_queued(i: int) -> None:
        await nc.request("$JS.API.STREAM.MSG.GET.RQ", get_request(f"rq.none{i}"), timeout=10)

    async def nothing_queued_direct(i: int) -> None:
        await nc.request("$JS.API.DIRECT.GET.RQ", get_request(f"rq.none{i}"), timeout=10)

    async def publish(i: int) -> None:
        await nc.request(f"kv.n{i}", b"z" * 300, timeout=10)

    async def compare_and_set(i: int) -> None:
        headers = {"Nats-Expected-Last-Subject-Sequence": "0"}
        await nc.request(f"kv.c{i}", b"z" * 300, headers=headers, timeout=10)

    async def request_plain(i: int) -> None:
        headers = {"Reply-To": f"_INBOX.abcdefghijklmnopqrstuv.{i}"}
        await nc.request(f"rd.p{i % 100}", b"q" * 60, headers=headers, timeout=10)

    async def request_typed(i: int) -> None:
        rid = f"01JF{i:022d}"
        headers = {
            h.CONTENT_TYPE: "application/cbor",
            h.MESSAGE_TYPE: "EnqueueUpdatesRequest",
            h.MESSAGE_VERSION: "1",
            h.NATS_MSG_ID: rid,
            h.REPLY_INBOX: f"_INBOX.abcdefghijklmnopqrstuv.{rid}",
            "Nats-Expected-Stream": "RD",
        }
        await nc.request(f"rd.t{i % 100}", b"q" * 60, headers=headers, timeout=10)

    async def task_duplicate(i: int) -> None:
        await nc.request("t.dup", b"", headers={"Nats-Msg-Id": "dup"}, timeout=10)

    async def consumer(i: int) -> None:
        config = {
            "filter_subject": f"rq.s{i}",
            "deliver_policy": "all",
            "deliver_subject": nc.new_inbox(),
            "ack_policy": "none",
            "max_deliver": 1,
            "flow_control": True,
            "idle_heartbeat": 5_000_000_000,
            "mem_storage": True,
            "num_replicas": 1,
            "inactive_threshold": 30_000_000_000,
        }
        request = json.dumps({"stream_name": "RQ", "config": config}).encode()
        created = await nc.request("$JS.API.CONSUMER.CREATE.RQ", request, timeout=10)
        name = json.loads(created.data)["name"]
        await nc.request(f"$JS.API.CONSUMER.DELETE.RQ.{name}", b"", timeout=10)

    async def renew(i: int) -> None:
        await nc.request(tasks[i].reply, b"+WPI", timeout=10)

    async def ack(i: int) -> None:
        await nc.request(tasks[i].reply, b"+ACK", timeout=10)

    async def delete(i: int) -> None:
        request = json.dumps({"seq": i + 1, "no_erase": True}).encode()
        await nc.request("$JS.API.STREAM.MSG.DELETE.RQ", request, timeout=10)

    pid = server.pid or 0
    print(f"nats-server CPU per operation, {count} of each, {_IN_FLIGHT} in flight:")
    await _measure(pid, "record read, STREAM.MSG.GET", msg_get, count)
    await _measure(pid, "record read, DIRECT.GET", direct_get, count)
    await _measure(pid, "nothing queued?, STREAM.MSG.GET", nothing_queued, count)
    await _measure(pid, "nothing queued?, DIRECT.GET", nothing_queued_direct, count)
    await _measure(pid, "publish, acked", publish, count)
    await _measure(pid, "compare-and-set publish, acked", compare_and_set, count)
    await _measure(pid, "request publish, hand-written (Reply-To only)", request_plain, count)
    await _measure(pid, "request publish, RebaserClient (6 headers, msg id)", request_typed, count)
    await nc.request("t.dup", b"", headers={"Nats-Msg-Id": "dup"}, timeout=10)
    await _measure(pid, "task publish, dropped as a duplicate", task_duplicate, count)
    await _measure(pid, "ordered consumer created and deleted", consumer, max(1, count // 3))
    await _measure(pid, "lease renewal (+WPI, confirmed)", renew, count)
    await _measure(pid, "delete by sequence (STREAM.MSG.DELETE)", delete, count)
    await _measure(pid, "task ack (+ACK, confirmed)", ack, count)
    await nc.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=3000, help="operations of each kind")
    args = parser.parse_args()
    with NatsServer(host="127.0.0.1") as server:
        asyncio.run(run(server, args.count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
