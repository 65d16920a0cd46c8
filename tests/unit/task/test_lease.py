"""The lease's arithmetic: what a confirmed renewal proves, measured on the monotonic clock (no server needed)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from rebaser_server.task.lease import Lease


def _lease(since: float, ack_wait: float = 10.0) -> Lease:
    nc = SimpleNamespace(is_connected=True)
    msg = SimpleNamespace(reply="$JS.ACK.t")
    return Lease(nc, msg, ack_wait=ack_wait, margin=0.0, since=since)  # type: ignore[arg-type]


def test_a_confirmation_extends_the_lease_from_the_renewal_confirmed_before_it() -> None:
    # A consumer leader answers a progress ack before its followers hold it: a leader change right then loses that
    # renewal, and the new leader counts ack_wait from the one before. The lease must not count on more.
    now = time.monotonic()
    lease = _lease(since=now - 4.0)  # pulled 4 s ago: held until 6 s from now
    assert 5.9 < lease.remaining() <= 6.0
    assert lease.confirmed(now - 1.0)  # the first renewal proves nothing beyond the delivery yet
    assert 5.9 < lease.remaining() <= 6.0
    assert lease.confirmed(now)  # the second extends from the first: 10 s after now - 1
    assert 8.9 < lease.remaining() <= 9.0
    assert lease.renewals == 2


def test_a_late_confirmation_of_an_older_renewal_never_shortens_or_overreaches() -> None:
    now = time.monotonic()
    lease = _lease(since=now - 4.0)
    assert lease.confirmed(now - 1.0)
    assert lease.confirmed(now)
    held = lease.remaining()
    # The confirmation of a renewal sent before the last confirmed one (answers reordered) extends from itself at
    # most, and never takes back what the lease already has.
    assert lease.confirmed(now - 2.0)
    assert abs(lease.remaining() - held) < 0.05
    assert lease.confirmed(now + 0.5)  # the next one extends from the last confirmed (now), not from itself
    assert 9.9 < lease.remaining() <= 10.0


def test_a_confirmation_after_the_lease_ran_out_proves_nothing() -> None:
    now = time.monotonic()
    lease = _lease(since=now - 11.0)  # ran out a second ago
    assert not lease.confirmed(now - 0.5)
    assert lease.remaining() < 0 and lease.renewals == 0
