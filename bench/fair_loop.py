"""The fair yardstick: the hand-written loop of ``bench/baseline.py`` plus the durable work any correct owner does.

The plain loop writes no state, so a ratio against it asks the daemon to match a loop that skips the commit. This one
does what the daemon must, the way a careful hand-written version would, and nothing more:

- **the daemon's lease**: the tasks consumer's ``ack_wait`` and the progress period are the daemon's defaults
  (2.5 s and 0.5 s), and one loop per worker renews every owned task with a *confirmed* progress ack (a publish
  whose reply names the renewal, one subscription for the confirmations), as ``rebaser_server.task.keeper`` does;
- **a record per change set**: read at the take (a KV get), committed with compare-and-set (``kv.update`` on the
  revision read or last written) after each request, before the request is deleted and answered; a refused write
  means another owner, and ends the ownership.

No versioned envelopes, idempotency window, fence epoch, event feed or DVU: what the daemon does beyond this is what
the ratios against this loop price. ``python -m bench.fair_loop --url U --prefix P --quiet S`` runs a worker, after
:func:`setup` made its streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from bench.baseline import Worker, main, publish_task, setup_streams

__all__ = ["ACK_WAIT", "PROGRESS_PERIOD", "FairWorker", "records_bucket", "setup"]

# The daemon's defaults (rebaser_core.settings: ack_wait, progress_period).
ACK_WAIT = 2.5
PROGRESS_PERIOD = 0.5


def records_bucket(prefix: str) -> str:
    return f"{prefix}_RECORDS"


async def setup(js: JetStreamContext, prefix: str) -> None:
    """The plain loop's streams, its tasks consumer on the daemon's lease, and the records bucket."""
    await setup_streams(js, prefix, ack_wait=ACK_WAIT)
    await js.create_key_value(
        bucket=records_bucket(prefix), history=1, storage=api.StorageType.FILE, direct=True
    )


class FairWorker(Worker):
    def __init__(self, nc: Client, prefix: str, quiet: float) -> None:
        super().__init__(nc, prefix, quiet)
        self.prefix = prefix
        self.kv: KeyValue | None = None
        self.leases: dict[int, Msg] = {}  # id(task message) -> the task message, renewed by renew_forever
        self.renewals_confirmed = 0
        self.fenced = 0
        self._inbox = nc.new_inbox()
        self._renewer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.kv = await self.js.key_value(records_bucket(self.prefix))
        await self.nc.subscribe(f"{self._inbox}.*", cb=self._on_confirmed)
        self._renewer = asyncio.create_task(self.renew_forever())

    async def _on_confirmed(self, msg: Msg) -> None:
        if not (msg.headers and "Status" in msg.headers):
            self.renewals_confirmed += 1

    async def renew_forever(self) -> None:
        """Every period, one confirmed progress ack per owned task: the daemon's lease keeper, by hand."""
        sent = 0
        while True:
            await asyncio.sleep(PROGRESS_PERIOD)
            for msg in list(self.leases.values()):
                sent += 1
                with contextlib.suppress(Exception):
                    await self.nc.publish(str(msg.reply), b"+WPI", reply=f"{self._inbox}.{sent}")

    async def own(self, task_msg: Msg) -> None:
        assert self.kv is not None
        kv = self.kv
        change_set = task_msg.subject.rsplit(".", 1)[-1]
        subject = f"{self.n['requests']}.{change_set}"
        self.leases[id(task_msg)] = task_msg
        try:
            try:
                revision = (await kv.get(change_set)).revision or 0
            except KeyNotFoundError:
                revision = 0
            await self._serve(task_msg, kv, change_set, subject, revision)
        finally:
            self.leases.pop(id(task_msg), None)

    async def _serve(self, task_msg: Msg, kv: KeyValue, key: str, subject: str, revision: int) -> None:
        last = time.monotonic()
        fenced = False
        deletes: set[asyncio.Task[None]] = set()

        async def on_request(msg: Msg) -> None:
            nonlocal last, revision, fenced
            if fenced:
                return
            body, reply_to = json.loads(msg.data), (msg.headers or {})["Reply-To"]
            seq = msg.metadata.sequence.stream
            record = json.dumps({"applied_seq": seq, "value": body["value"]}).encode()
            try:
                revision = await kv.update(key, record, last=revision)
            except KeyWrongLastSequenceError:
                fenced = True  # another owner committed: stop applying, let the task go
                self.fenced += 1
                return
            task = asyncio.create_task(self.delete(seq))
            deletes.add(task)
            task.add_done_callback(deletes.discard)
            await self.nc.publish(reply_to, json.dumps({"ok": True, "value": body["value"]}).encode())
            last = time.monotonic()

        sub = await self.subscribe_requests(subject, on_request)
        # The quiet timer of the plain loop: polled, at most once a second.
        while (idle := time.monotonic() - last) < self.quiet and not self.stopping and not fenced:  # noqa: ASYNC110
            await asyncio.sleep(min(self.quiet - idle, 1.0) + 0.001)
        await sub.unsubscribe()
        if deletes:
            await asyncio.wait(set(deletes), timeout=10.0)
        if self.stopping or fenced:
            await task_msg.nak()
            return
        await task_msg.ack_sync(timeout=10.0)
        try:  # check after ack: a request published while letting go must get a task
            await self.js.get_last_msg(self.n["requests_stream"], subject, direct=True)
        except NotFoundError:
            return
        await publish_task(self.nc, task_msg.subject)


if __name__ == "__main__":
    main(FairWorker, __doc__)
