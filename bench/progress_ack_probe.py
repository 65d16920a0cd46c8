"""Can a *confirmed* progress ack be lost when a replicated consumer's leader steps down? (A NATS fact the lease
rests on: ``rebaser_server/task/lease.py``.)

``python bench/progress_ack_probe.py [--trials N] [--ack-wait S]`` starts a 3-node cluster on loopback, an R3
work-queue stream and a durable pull consumer with ``ack_wait`` S (2 s), and per trial: pulls a message, sends a
progress ack (``+WPI`` with a reply subject) halfway through ``ack_wait``, and asks the consumer's leader to step
down, in one of two ways:

- ``at once``: the step-down request is sent right behind the progress ack;
- ``after``: only once the progress ack was confirmed and 0.3 s more have passed.

It then waits for the redelivery and prints, per way, how many confirmed renewals were honoured and how many were
lost: the message redelivered before ``ack_wait`` after the confirmed progress ack was sent (the new leader kept the
timer of the delivery). A lost one in ``at once`` and none in ``after`` is the window the lease allows for: a
confirmation extends a lease only from the renewal confirmed before it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import nats
from nats.aio.msg import Msg
from nats.js import api

from rebaser_core.embedded.cluster import NatsCluster

_STREAM, _CONSUMER = "PROBE", "probe"
_STEPDOWN = f"$JS.API.CONSUMER.LEADER.STEPDOWN.{_STREAM}.{_CONSUMER}"
# A redelivery this much earlier than ack_wait after the confirmed renewal counts as the renewal lost (clock noise).
_SLACK = 0.1


async def _trial(nc: nats.NATS, n: int, ack_wait: float, at_once: bool) -> str:
    """'honoured', 'lost', 'unconfirmed' (the progress ack got no answer: nothing was promised) or 'none'."""
    js = nc.jetstream(timeout=10)
    sub = await js.pull_subscribe_bind(_CONSUMER, _STREAM)
    try:
        await js.publish(f"probe.{n}", b"x")
        # The first trial after a step-down waits out the election it started.
        msg = await _next(sub, time.monotonic() + 30)
        if msg is None:
            raise RuntimeError("the probe's message was never delivered")
        await asyncio.sleep(ack_wait / 2)
        sent = time.monotonic()
        # Tasks run in the order made: the progress ack is published first, the step-down (at once) right behind it.
        renewal = asyncio.ensure_future(nc.request(str(msg.reply), b"+WPI", timeout=5))
        if at_once:
            stepdown = asyncio.ensure_future(nc.request(_STEPDOWN, b"", timeout=10))
        try:
            await renewal
            ok = True
        except (
            TimeoutError,
            nats.errors.Error,
        ):  # no answer, or a status (no responders): nothing was promised
            ok = False
        if not at_once:
            await asyncio.sleep(0.3)
            stepdown = asyncio.ensure_future(nc.request(_STEPDOWN, b"", timeout=10))
        await stepdown
        # The first delivery after the step-down: wait past the renewal's ack_wait and a leader's first look.
        again = await _next(sub, sent + ack_wait + 2.5)
        if again is None:
            await msg.term()
            return "none"
        redelivered = time.monotonic()
        await again.term()
        if not ok:
            return "unconfirmed"
        return "lost" if redelivered < sent + ack_wait - _SLACK else "honoured"
    finally:
        await sub.unsubscribe()


async def _next(sub: Any, until: float) -> Msg | None:
    """The next message delivered before ``until`` (monotonic), or None."""
    while (left := until - time.monotonic()) > 0:
        try:
            return (await sub.fetch(1, timeout=max(0.05, min(left, 1.0))))[0]
        except (TimeoutError, nats.errors.Error):
            await asyncio.sleep(0.05)  # no message yet, or no consumer leader yet (409, 503)
    return None


async def _probe(urls: list[str], trials: int, ack_wait: float) -> int:
    nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(
            name=_STREAM,
            subjects=["probe.>"],
            retention=api.RetentionPolicy.WORK_QUEUE,
            num_replicas=3,
            storage=api.StorageType.FILE,
        )
        await js.add_consumer(
            _STREAM,
            api.ConsumerConfig(
                durable_name=_CONSUMER, ack_policy=api.AckPolicy.EXPLICIT, ack_wait=ack_wait, num_replicas=3
            ),
        )
        results: dict[str, dict[str, int]] = {"at once": {}, "after": {}}
        for n in range(trials):
            for way in results:
                outcome = await _trial(nc, 2 * n + (way == "after"), ack_wait, way == "at once")
                results[way][outcome] = results[way].get(outcome, 0) + 1
                print(f"trial {n + 1}/{trials} {way}: {outcome}", flush=True)
        print(f"\nack_wait {ack_wait:g} s, {trials} trials each way, consumer leader stepped down:")
        for way, counts in results.items():
            shown = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            print(f"  step-down {way}: {shown}")
        return 0
    finally:
        await nc.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--ack-wait", type=float, default=2.0)
    args = parser.parse_args()
    with NatsCluster(3) as cluster:
        return asyncio.run(_probe(cluster.urls, args.trials, args.ack_wait))


if __name__ == "__main__":
    raise SystemExit(main())
