"""The heartbeat's arithmetic (``lease_mode`` daemon): what a confirmed put proves, and that a lapse ends every lease
taken before it for good (no server needed)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from rebaser_server.task.heartbeat import Heartbeat, heartbeat_key
from rebaser_server.task.lease import Lease


def _heartbeat(ack_wait: float = 2.5) -> Heartbeat:
    return Heartbeat("host:12:01ABC", ack_wait=ack_wait, margin=0.5, period=0.5)


def _lease(heartbeat: Heartbeat, since: float) -> Lease:
    nc = SimpleNamespace(is_connected=True)
    msg = SimpleNamespace(reply="$JS.ACK.t")
    return Lease(nc, msg, ack_wait=30.0, margin=6.0, since=since, heartbeat=heartbeat)  # type: ignore[arg-type]


def test_the_key_is_the_owner_name_made_a_valid_key() -> None:
    assert heartbeat_key("vm-1.example:2345:01M8YW") == "vm-1_example_2345_01M8YW"


def test_never_confirmed_holds_nothing() -> None:
    heartbeat = _heartbeat()
    assert not heartbeat.held() and not heartbeat.covers(heartbeat.generation)


def test_a_confirmed_put_holds_from_its_send_time() -> None:
    heartbeat, now = _heartbeat(), time.monotonic()
    heartbeat.confirmed(now - 1.0)
    # Held until the send time plus ack_wait, less the margin: 2.5 - 1.0 - 0.5 from now.
    assert 0.9 < heartbeat.remaining() <= 1.0
    assert heartbeat.generation == 1 and heartbeat.covers(1)
    heartbeat.confirmed(now)
    assert 1.9 < heartbeat.remaining() <= 2.0 and heartbeat.generation == 1
    heartbeat.confirmed(now - 2.0)  # an older put confirmed late never takes back what is held
    assert 1.9 < heartbeat.remaining() <= 2.0


def test_a_lapse_ends_every_lease_taken_before_it_even_once_the_heartbeat_is_back() -> None:
    heartbeat, now = _heartbeat(), time.monotonic()
    heartbeat.confirmed(now)
    lease = _lease(heartbeat, since=now)
    assert 1.9 < lease.remaining() <= 2.0  # the heartbeat bounds it, not the task's own 30 s
    assert lease.held()
    heartbeat.confirmed(now - 10.0)  # stale: changes nothing
    assert lease.held()
    lapsed = _heartbeat()
    lapsed.confirmed(now - 5.0)  # its last put was 5 s ago: lapsed 2.5 s ago
    old = _lease(lapsed, since=now)
    assert not lapsed.held() and not old.held()
    lapsed.confirmed(now)  # beating again: a peer may have handed back what was held meanwhile
    assert lapsed.held() and lapsed.generation == 2
    assert not old.held() and old.remaining() < 0  # for good
    new = _lease(lapsed, since=now)
    assert new.held()


def test_a_task_renewal_confirmed_after_a_lapse_does_not_revive_the_lease() -> None:
    heartbeat, now = _heartbeat(), time.monotonic()
    heartbeat.confirmed(now - 5.0)
    lease = _lease(heartbeat, since=now)
    assert lease.confirmed(now)  # the task's own delivery is fine ...
    assert not lease.held()  # ... but the daemon's heartbeat is not
