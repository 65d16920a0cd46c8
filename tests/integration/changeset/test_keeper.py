"""The lease keeper's loop: one pass per period however many change sets start, and still prompt for a lease that
runs out sooner.

A loop woken by every new change set for a pass over *every* watched one is quadratic under a burst of activations
(at 300 owned change sets, a third of a millisecond of CPU per activation).
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from nats.aio.client import Client as NatsClient

from rebaser_core.testing import wait_for
from rebaser_server.task.keeper import LeaseKeeper
from rebaser_server.task.lease import Lease


class _Watched:
    def __init__(self, nc: NatsClient, n: int, lasts: float) -> None:
        # Renewals go to a subject nobody answers: only the loop's passes are looked at here.
        msg = SimpleNamespace(reply=f"keeper.test.{n}")
        self.lease = Lease(nc, msg, ack_wait=lasts, margin=0.0, since=time.monotonic())  # type: ignore[arg-type]
        self.watched = 0

    def watch(self, now: float) -> bool:
        self.watched += 1
        return True


async def test_starting_change_sets_does_not_make_a_pass_over_all_of_them(nc: NatsClient) -> None:
    keeper = LeaseKeeper(nc, period=10.0)  # as in production: well under the leases (ack_wait)
    await keeper.start()
    try:
        watched = [_Watched(nc, n, lasts=60.0) for n in range(300)]
        for w in watched:
            keeper.add(w)
            for _ in range(3):  # let the loop run, as it does between activations
                await asyncio.sleep(0)
        passes = sum(w.watched for w in watched)
        # A pass per activation would be 300 * 299 / 2 = 44,850 calls; the loop's period is far away.
        assert passes < len(watched), passes
    finally:
        await keeper.stop()


async def test_a_lease_that_runs_out_before_the_next_pass_is_watched_at_once(nc: NatsClient) -> None:
    keeper = LeaseKeeper(nc, period=10.0)  # as in production: well under the leases (ack_wait)
    await keeper.start()
    try:
        keeper.add(_Watched(nc, 0, lasts=60.0))
        for _ in range(3):
            await asyncio.sleep(0)  # the loop now sleeps until the next period (10 s)
        short = _Watched(nc, 1, lasts=0.3)
        keeper.add(short)
        await wait_for(lambda: short.watched > 0, timeout=5, message="the short lease watched")
    finally:
        await keeper.stop()


async def test_a_new_lease_is_renewed_by_the_next_pass_not_at_once(nc: NatsClient) -> None:
    renewals: list[bytes] = []

    async def on_renewal(msg: Any) -> None:
        renewals.append(msg.data)

    keeper = LeaseKeeper(nc, period=0.2)
    await keeper.start()
    sub = await nc.subscribe("keeper.test.>", cb=on_renewal)
    try:
        sent = nc.stats["out_msgs"]
        keeper.add(_Watched(nc, 0, lasts=60.0))
        # A change set that lets go before the next pass (most of a burst of one-request ones) costs no renewal.
        assert nc.stats["out_msgs"] == sent
        await wait_for(lambda: renewals == [b"+WPI"], timeout=5, message="renewed by the next pass")
    finally:
        await sub.unsubscribe()
        await keeper.stop()
