"""The lease keeper's loop: one pass per period however many change sets start, and still prompt for a lease that
runs out sooner; every period for a change set with work in hand, only when due for an idle one.

Every new change set used to wake the loop for a pass over *every* watched one: under a burst of activations that
was quadratic (at 300 owned change sets, a third of a millisecond of CPU per activation).
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from nats.aio.client import Client as NatsClient

from rebaser_core.testing import wait_for
from rebaser_server.keeper import LeaseKeeper
from rebaser_server.lease import Lease


class _Watched:
    def __init__(self, nc: NatsClient, n: int, lasts: float, *, idle: bool = False) -> None:
        # Renewals go to a subject nobody answers: only the loop's passes are looked at here.
        msg = SimpleNamespace(reply=f"keeper.test.{n}")
        self.lease = Lease(nc, msg, ack_wait=lasts, margin=0.0, since=time.monotonic())  # type: ignore[arg-type]
        self.watched = 0
        self.is_idle = idle

    def watch(self, now: float) -> bool:
        self.watched += 1
        return True

    def idle(self) -> bool:
        return self.is_idle


class _Renewals:
    """The renewals sent, by the watched change set's number."""

    def __init__(self) -> None:
        self.by_watched: dict[int, int] = {}

    async def on_renewal(self, msg: Any) -> None:
        n = int(msg.subject.rsplit(".", 1)[-1])
        self.by_watched[n] = self.by_watched.get(n, 0) + 1

    def __getitem__(self, n: int) -> int:
        return self.by_watched.get(n, 0)


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


async def test_an_idle_change_set_is_renewed_only_once_its_lease_has_two_periods_left(nc: NatsClient) -> None:
    renewals = _Renewals()
    period = 0.05
    keeper = LeaseKeeper(nc, period=period)
    await keeper.start()
    sub = await nc.subscribe("keeper.test.>", cb=renewals.on_renewal)
    try:
        busy = _Watched(nc, 0, lasts=60.0)
        idle = _Watched(nc, 1, lasts=60.0, idle=True)
        keeper.add(busy)
        keeper.add(idle)
        await wait_for(lambda: renewals[0] >= 5, timeout=10, message="the busy lease renewed every pass")
        await nc.flush()
        # Nobody confirms these renewals, so neither lease grows; the idle one still has far more than two periods.
        assert renewals[1] == 0
        # Idle with little left (its last renewal lost, say): renewed once two periods or less are left.
        keeper.add(_Watched(nc, 2, lasts=6 * period, idle=True))
        await wait_for(lambda: renewals[2] >= 1, timeout=10, message="the short idle lease renewed")
        # Work in hand again: renewed on the next passes whatever is left.
        idle.is_idle = False
        await wait_for(lambda: renewals[1] >= 2, timeout=10, message="the formerly idle lease renewed")
    finally:
        await sub.unsubscribe()
        await keeper.stop()
