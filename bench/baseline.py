"""The plain yardstick: the same task lifecycle written as a minimal raw nats-py loop (no versioning, no KV, no
storage). The targets are set against the fair one, ``bench/fair_loop.py`` (the daemon's lease and a record per change
set, committed after each request); this one stays as a reference.

Client: publish the request (await the JetStream ack), then the empty task (err_code 10077 = already has one).
Worker (``python -m bench.baseline --url U --prefix P --quiet S``): pull tasks from one shared durable consumer (in
batches, each task taken as it arrives);
per task, an ordered push consumer on the change set's request subject; per request reply on the ``Reply-To``
header and delete it by sequence (raw ``no_erase`` delete); after ``quiet`` seconds without a request, stop
consuming, ack the task, then check "anything still queued?" and republish the task if so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

TASK_EXISTS = 10077


def names(prefix: str) -> dict[str, str]:
    return {
        "tasks_stream": f"{prefix}_TASKS",
        "requests_stream": f"{prefix}_REQUESTS",
        "tasks": f"{prefix}.tasks",
        "requests": f"{prefix}.requests",
    }


async def setup_streams(js: JetStreamContext, prefix: str, *, ack_wait: float = 30.0) -> None:
    """The streams and the tasks consumer (the fair loop's ``setup`` gives it the daemon's ``ack_wait``)."""
    n = names(prefix)
    await js.add_stream(
        name=n["tasks_stream"],
        subjects=[f"{n['tasks']}.>"],
        retention=api.RetentionPolicy.WORK_QUEUE,
        discard=api.DiscardPolicy.NEW,
        max_msgs_per_subject=1,
        discard_new_per_subject=True,
        storage=api.StorageType.FILE,
    )
    await js.add_stream(
        name=n["requests_stream"],
        subjects=[f"{n['requests']}.>"],
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        max_consumers=20_000,  # one ordered consumer per active change set; the server default caps at 1,000
        allow_direct=True,
    )
    config = api.ConsumerConfig(
        durable_name="tasks", ack_policy=api.AckPolicy.EXPLICIT, ack_wait=ack_wait, max_ack_pending=20_000
    )
    await js.add_consumer(n["tasks_stream"], config)


async def publish_task(nc: Client, subject: str) -> None:
    reply = json.loads((await nc.request(subject, b"", timeout=10.0)).data)
    error = reply.get("error")
    if error and error.get("err_code") != TASK_EXISTS:
        raise RuntimeError(f"task publish refused: {error}")


class BaselineClient:
    """Request with reply: one wildcard inbox subscription, a future per request."""

    def __init__(self, nc: Client, prefix: str) -> None:
        self._nc, self._n = nc, names(prefix)
        self._inbox = nc.new_inbox()
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self._sub: Any = None
        self._next = 0

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_reply)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_reply(self, msg: Msg) -> None:
        future = self._waiting.get(msg.subject.rsplit(".", 1)[-1])
        if future is not None and not future.done():
            future.set_result(json.loads(msg.data))

    async def call(self, change_set: str, value: int, timeout: float) -> Any:
        self._next += 1
        rid = str(self._next)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = future
        try:
            async with asyncio.timeout(timeout):
                subject = f"{self._n['requests']}.{change_set}"
                body = json.dumps({"path": "/n", "value": value}).encode()
                ack = await self._nc.request(
                    subject, body, timeout=timeout, headers={"Reply-To": f"{self._inbox}.{rid}"}
                )
                if "error" in json.loads(ack.data):
                    raise RuntimeError(f"request publish refused: {ack.data!r}")
                await publish_task(self._nc, f"{self._n['tasks']}.{change_set}")
                return await future
        finally:
            self._waiting.pop(rid, None)


class Worker:
    def __init__(self, nc: Client, prefix: str, quiet: float) -> None:
        self.nc, self.js, self.n, self.quiet = nc, nc.jetstream(timeout=10.0), names(prefix), quiet
        self.stopping = False
        self.owned: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Before the first pull (the fair loop opens its records bucket and starts renewing)."""

    async def pull(self) -> None:
        """Pull requests for up to 256 tasks, each task owned the moment it arrives (nats-py's ``fetch(n)`` would
        wait for all n); the next pull goes out when this one is complete or has expired."""
        inbox, done, remaining = self.nc.new_inbox(), asyncio.Event(), 0

        async def on_task(msg: Msg) -> None:
            nonlocal remaining
            if not msg.data and msg.headers and "Status" in msg.headers:
                done.set()  # expired (408)
                return
            remaining -= 1
            if remaining <= 0:
                done.set()
            if self.stopping:
                await msg.nak()
                return
            task = asyncio.create_task(self.own(msg))
            self.owned.add(task)
            task.add_done_callback(self.owned.discard)

        sub = await self.nc.subscribe(inbox, cb=on_task)
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.n['tasks_stream']}.tasks"
        while not self.stopping:
            done.clear()
            remaining = 256
            request = json.dumps({"batch": remaining, "expires": 1_000_000_000}).encode()
            await self.nc.publish(subject, request, reply=inbox)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await done.wait()
        await sub.unsubscribe()

    async def subscribe_requests(self, subject: str, cb: Callable[[Msg], Awaitable[None]]) -> Any:
        """The change set's ordered push consumer, delivering to ``cb``."""
        sub = await self.js.subscribe(
            subject, stream=self.n["requests_stream"], cb=cb, ordered_consumer=True, idle_heartbeat=5.0
        )
        # As the daemon does (rebaser_server.changeset.consumer): nats-py's flow-control polling task has
        # nothing to send for a callback subscription, and wakes four times a second per owned change set.
        fctask = sub._sub._jsi._fctask
        if fctask is not None:
            fctask.cancel()
            sub._sub._jsi._fctask = None
        return sub

    async def delete(self, seq: int) -> None:
        payload = json.dumps({"seq": seq, "no_erase": True}).encode()
        await self.nc.request(f"$JS.API.STREAM.MSG.DELETE.{self.n['requests_stream']}", payload, timeout=10.0)

    async def own(self, task_msg: Msg) -> None:
        change_set = task_msg.subject.rsplit(".", 1)[-1]
        subject = f"{self.n['requests']}.{change_set}"
        last = time.monotonic()
        deletes: set[asyncio.Task[None]] = set()

        async def on_request(msg: Msg) -> None:
            nonlocal last
            body, reply_to = json.loads(msg.data), (msg.headers or {})["Reply-To"]
            await self.nc.publish(reply_to, json.dumps({"ok": True, "value": body["value"]}).encode())
            task = asyncio.create_task(self.delete(msg.metadata.sequence.stream))
            deletes.add(task)
            task.add_done_callback(deletes.discard)
            last = time.monotonic()

        sub = await self.subscribe_requests(subject, on_request)
        progress = time.monotonic()
        while (idle := time.monotonic() - last) < self.quiet and not self.stopping:
            await asyncio.sleep(min(self.quiet - idle, 1.0) + 0.001)
            if time.monotonic() - progress > 10.0:
                await task_msg.in_progress()
                progress = time.monotonic()
        await sub.unsubscribe()
        if deletes:
            await asyncio.wait(set(deletes), timeout=10.0)
        if self.stopping:
            await task_msg.nak()
            return
        await task_msg.ack_sync(timeout=10.0)
        try:  # check after ack: a request published while letting go must get a task
            await self.js.get_last_msg(self.n["requests_stream"], subject, direct=True)
        except NotFoundError:
            return
        await publish_task(self.nc, task_msg.subject)


async def serve(url: str, prefix: str, quiet: float, worker_class: type[Worker] = Worker) -> None:
    nc = await nats.connect(url, max_reconnect_attempts=-1)
    worker = worker_class(nc, prefix, quiet)
    await worker.start()
    # The daemon's garbage-collector settings (rebaser_server.cli.main.tune_gc), so the yardstick gets them too;
    # the same variable turns them off for both (--daemon-env REBASER_GC_THRESHOLD=0).
    threshold = int(os.environ.get("REBASER_GC_THRESHOLD", "100000"))
    if threshold > 0:
        gc.collect()
        gc.freeze()
        gc.set_threshold(threshold, *gc.get_threshold()[1:])
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    puller = asyncio.create_task(worker.pull())
    print("baseline worker ready", flush=True)
    await stop.wait()
    worker.stopping = True
    with contextlib.suppress(Exception):
        await asyncio.wait_for(puller, timeout=3.0)
    if worker.owned:
        await asyncio.wait(set(worker.owned), timeout=5.0)
    await nc.close()


def main(worker_class: type[Worker] = Worker, description: str | None = __doc__) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--quiet", type=float, default=5.0)
    args = parser.parse_args()
    asyncio.run(serve(args.url, args.prefix, args.quiet, worker_class))


if __name__ == "__main__":
    main()
