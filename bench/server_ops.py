"""nats-server CPU per JetStream operation: what each call of an activation asks of the server.

``python bench/server_ops.py [--count N]`` starts an embedded nats-server (file storage), fills a KV-like stream
(one message per subject), a requests-like stream and a work-queue stream with a durable pull consumer, then runs
``N`` of each operation below, 32 in flight, and prints the server's CPU time (user + system, from ``/proc``) per
operation. The client is one nats-py connection in this process; only the server is measured, so the figures hold
for the daemon and the hand-written loop alike:

- a record read: ``STREAM.MSG.GET`` (the stream leader's answer, JSON with the message in base64) against a direct
  get (``DIRECT.GET``, the message itself);
- a publish with a publish ack, and a compare-and-set one (``Nats-Expected-Last-Subject-Sequence``);
- a record's rewrite as a commit makes it (compare-and-set, over the key's last revision) without a header, and with
  a ``Rebaser-Events`` header of 1.5 KiB and of 3 KiB: what the event feed's window costs the server on every write
  (a window of 16 events is 1.4-2.7 KiB, docs/capacity.md);
- a request's publish as each side sends it: the hand-written client's (one ``Reply-To`` header) and
  ``RebaserClient``'s (content type, message type, version, reply inbox, ``Nats-Expected-Stream`` and a
  ``Nats-Msg-Id`` the stream remembers for its duplicate window, 120 s); and a task publish that the work queue
  drops as a duplicate (every request after a change set's first);
- a "nothing queued?" check (``STREAM.MSG.GET`` of a subject with no message);
- an ordered push consumer's creation and deletion;
- a progress ack (``+WPI``, a lease renewal) with a reply subject, which the server confirms, and one without (what
  the confirmation itself costs), a confirmed ``+ACK``, and a delete
  by sequence (``STREAM.MSG.DELETE``).

``--removal C[,C...]`` then prices the ways processed requests and consumers can be removed, on a fresh requests-like
stream with ``C`` idle ordered consumers on other subjects (every owned change set has one):

- a delete by sequence per message, against a filtered purge (``STREAM.PURGE`` with ``filter`` and ``seq``) that
  removes 1, 4 or 16 messages at once: a purge visits every consumer of the stream, so its price grows with ``C``;
- an ordered consumer's creation, its deletion (``CONSUMER.DELETE``), and the alternative of unsubscribing and
  letting the server reap it after a 1 s ``inactive_threshold``.

Single figures move by 10-20 % from run to run on a shared 2-core machine; compare operations within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import nats
from nats.js import api

from bench.procs import cpu_seconds
from rebaser_core import headers as h
from rebaser_core.embedded import NatsServer
from rebaser_server.changeset.consumer import consumer_config

_IN_FLIGHT = 32


async def _measure(pid: int, name: str, op: Callable[[int], Awaitable[object]], count: int) -> None:
    limit = asyncio.Semaphore(_IN_FLIGHT)

    async def one(i: int) -> None:
        async with limit:
            await op(i)

    before = cpu_seconds(pid)
    await asyncio.gather(*(one(i) for i in range(count)))
    _report(name, cpu_seconds(pid) - before, count)


def _report(name: str, used: float, count: int) -> None:
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

    async def rewriting(window: int) -> Callable[[int], Awaitable[object]]:
        # Each key written once first; the measured write replaces it, as a commit replaces the record's last revision.
        seqs = []
        for i in range(count):
            ack = await js.publish(f"kv.w{window}.{i}", b"r" * 300)
            seqs.append(ack.seq)
        events = {"Rebaser-Events": "e" * window} if window else {}

        async def rewrite(i: int) -> None:
            headers = {"Nats-Expected-Last-Subject-Sequence": str(seqs[i]), **events}
            await nc.request(f"kv.w{window}.{i}", b"z" * 300, headers=headers, timeout=10)

        return rewrite

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
        request = _consumer_request(f"rq.s{i}", nc.new_inbox())
        created = await nc.request("$JS.API.CONSUMER.CREATE.RQ", request, timeout=10)
        name = json.loads(created.data)["name"]
        await nc.request(f"$JS.API.CONSUMER.DELETE.RQ.{name}", b"", timeout=10)

    async def renew(i: int) -> None:
        await nc.request(tasks[i].reply, b"+WPI", timeout=10)

    async def ack(i: int) -> None:
        await nc.request(tasks[i].reply, b"+ACK", timeout=10)

    pid = server.pid or 0
    print(f"nats-server CPU per operation, {count} of each, {_IN_FLIGHT} in flight:")
    await _measure(pid, "record read, STREAM.MSG.GET", msg_get, count)
    await _measure(pid, "record read, DIRECT.GET", direct_get, count)
    await _measure(pid, "nothing queued?, STREAM.MSG.GET", nothing_queued, count)
    await _measure(pid, "nothing queued?, DIRECT.GET", nothing_queued_direct, count)
    await _measure(pid, "publish, acked", publish, count)
    await _measure(pid, "compare-and-set publish, acked", compare_and_set, count)
    for window, name in (
        (0, "record rewrite, no header"),
        (1536, "record rewrite, 1.5 KiB window"),
        (3072, "record rewrite, 3 KiB window"),
    ):
        await _measure(pid, name, await rewriting(window), count)
    await _measure(pid, "request publish, hand-written (Reply-To only)", request_plain, count)
    await _measure(pid, "request publish, RebaserClient (6 headers, msg id)", request_typed, count)
    await nc.request("t.dup", b"", headers={"Nats-Msg-Id": "dup"}, timeout=10)
    await _measure(pid, "task publish, dropped as a duplicate", task_duplicate, count)
    await _measure(pid, "ordered consumer created and deleted", consumer, max(1, count // 3))
    await _measure(pid, "lease renewal (+WPI, confirmed)", renew, count)
    before = cpu_seconds(pid)
    for i in range(count):
        await nc.publish(tasks[i].reply, b"+WPI")
        if i % _IN_FLIGHT == _IN_FLIGHT - 1:
            await nc.flush()  # a round trip per 32, as many in flight as the others
    await nc.flush()  # the server has read them all once it answers this
    _report("lease renewal (+WPI, not confirmed)", cpu_seconds(pid) - before, count)
    await _measure(
        pid, "delete by sequence (STREAM.MSG.DELETE)", _deleting(nc, list(range(1, count + 1))), count
    )
    await _measure(pid, "task ack (+ACK, confirmed)", ack, count)
    await nc.close()


def _consumer_request(subject: str, inbox: str, inactive_threshold: float | None = None) -> bytes:
    """The daemon's CONSUMER.CREATE body for a change set's request consumer
    (rebaser_server.changeset.consumer), on stream
    RQ; with another ``inactive_threshold`` if given."""
    config = consumer_config(subject, inbox, heartbeat=5.0, start=None)
    if inactive_threshold is not None:
        config["inactive_threshold"] = int(inactive_threshold * 1e9)
    return json.dumps({"stream_name": "RQ", "config": config}).encode()


def _deleting(nc: Any, seqs: list[int]) -> Callable[[int], Awaitable[object]]:
    """An operation for :func:`_measure`: the ``i``-th one deletes stream sequence ``seqs[i]`` of stream RQ."""

    async def delete(i: int) -> None:
        request = b'{"seq":%d,"no_erase":true}' % seqs[i]
        await nc.request("$JS.API.STREAM.MSG.DELETE.RQ", request, timeout=10)

    return delete


def _purging(nc: Any, groups: list[tuple[str, int]]) -> Callable[[int], Awaitable[object]]:
    """An operation for :func:`_measure`: the ``g``-th one purges subject ``groups[g][0]`` up to and including
    sequence ``groups[g][1]``."""

    async def purge(g: int) -> None:
        subject, last = groups[g]
        request = json.dumps({"filter": subject, "seq": last + 1}).encode()
        await nc.request("$JS.API.STREAM.PURGE.RQ", request, timeout=10)

    return purge


async def removal(server: NatsServer, count: int, consumers: int) -> None:
    """Deletes against filtered purges, and a consumer's deletion against its reaping, with ``consumers`` idle
    consumers on the stream (see the module docstring)."""
    nc = await nats.connect(server.url)
    js = nc.jetstream()
    await js.add_stream(
        api.StreamConfig(
            name="RQ", subjects=["rq.>"], storage=api.StorageType.FILE, max_consumers=consumers + count + 100
        )
    )
    for i in range(consumers):
        inbox = nc.new_inbox()
        await nc.subscribe(inbox)  # interest on its deliver subject: active, never reaped
        await nc.request("$JS.API.CONSUMER.CREATE.RQ", _consumer_request(f"rq.idle{i}", inbox), timeout=10)
    pid = server.pid or 0
    print(f"nats-server CPU to remove processed requests, {consumers} idle consumers on the stream:")
    subjects = 200
    for k in (1, 4, 16):
        n = max(k, count // k * k)
        seqs = [(await js.publish(f"rq.s{i % subjects}", b"q" * 200)).seq for i in range(n)]

        if k == 1:
            await _measure(pid, "delete by sequence, a message", _deleting(nc, seqs), n)
        # k consecutive messages of one subject, removed by one purge below the last one's sequence.
        groups = []
        for g in range(n // k):
            subject = f"rq.p{g % subjects}"
            last = 0
            for _ in range(k):
                last = (await js.publish(subject, b"q" * 200)).seq
            groups.append((subject, last))

        await _measure(pid, f"filtered purge of {k} messages (per purge)", _purging(nc, groups), len(groups))

    half = max(1, count // 2)
    # The first half is deleted by the API, the second unsubscribed and left for the server to reap (1 s).
    made: dict[int, tuple[str, Any]] = {}

    async def create(i: int) -> None:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        threshold = None if i < half else 1.0  # the daemon's own (30 s), or 1 s for the server to reap
        answer = await nc.request(
            "$JS.API.CONSUMER.CREATE.RQ", _consumer_request(f"rq.c{i}", inbox, threshold), timeout=10
        )
        made[i] = (json.loads(answer.data)["name"], sub)

    await _measure(pid, "ordered consumer created", create, 2 * half)

    async def delete_consumer(i: int) -> None:
        await nc.request(f"$JS.API.CONSUMER.DELETE.RQ.{made[i][0]}", b"", timeout=10)

    await _measure(pid, "ordered consumer deleted (CONSUMER.DELETE)", delete_consumer, half)
    for i in range(half):
        await made[i][1].unsubscribe()
    before = cpu_seconds(pid)
    for i in range(half, 2 * half):
        await made[i][1].unsubscribe()
    await nc.flush()
    for _ in range(600):  # reaped after about a second; 60 s at most
        if (await js.stream_info("RQ")).state.consumer_count <= consumers:
            break
        await asyncio.sleep(0.1)
    _report("ordered consumer unsubscribed and reaped (1 s threshold)", cpu_seconds(pid) - before, half)
    await nc.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=3000, help="operations of each kind")
    parser.add_argument(
        "--removal",
        default="",
        metavar="C[,C...]",
        help="also price deletes, filtered purges and consumer removal with C idle consumers on the stream",
    )
    args = parser.parse_args()
    with NatsServer(host="127.0.0.1") as server:
        asyncio.run(run(server, args.count))
    for consumers in (int(c) for c in args.removal.split(",") if c):
        with NatsServer(host="127.0.0.1") as server:
            asyncio.run(removal(server, args.count, consumers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
