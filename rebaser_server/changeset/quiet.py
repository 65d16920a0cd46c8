"""When an owned change set lets go: the quiet rule, as pure logic (no NATS, no clock of its own).

The processor asks :func:`look` each time it wakes up while it owns a change set: release now, or look again
when? The watchdog asks :func:`may_give_way` on every pass, to wake the processor early when others wait for a
slot.

- A change set whose consumer has **caught up** (nothing queued) lets go after ``quiescent_period`` without a
  request; while others wait for a slot (the daemon is full) or its shard moves away (a layout change drains it),
  after :data:`PRESSURE_QUIET` instead.
- Before its consumer has caught up, a gap is slow delivery (a busy machine, flow control), not a quiet change set:
  releasing then would only cost a re-take. It gives up only after ``max(2 x quiescent_period, nats_timeout)`` (a
  stalled consumer; the release check hands the queued requests to a fresh activation).
- A change set idle long enough but with a request in hand (its step waits for something) does not let go under
  it: it looks again when that request ends.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PRESSURE_QUIET", "Look", "look", "may_give_way", "release_after"]

PRESSURE_QUIET = 1.0
"""Seconds without a request after which a caught-up change set gives way to others waiting for a slot."""

# Looked again this much after the limit, so a wake-up right at it does not find the change set a hair short.
_SLACK = 0.001


@dataclass(frozen=True, slots=True)
class Look:
    """What the processor does next: release now (``release`` is why), or look again within ``wait`` seconds,
    and also as soon as the request in hand ends if ``after_request``."""

    release: str | None = None
    wait: float = 0.0
    after_request: bool = False


def release_after(
    quiescent_period: float, nats_timeout: float, *, caught_up: bool, giving_way: bool
) -> float:
    """How long without a request before the change set lets go (see the module docstring)."""
    if not caught_up:
        return max(2 * quiescent_period, nats_timeout)
    return min(quiescent_period, PRESSURE_QUIET) if giving_way else quiescent_period


def look(
    idle: float,
    *,
    quiescent_period: float,
    nats_timeout: float,
    caught_up: bool,
    giving_way: bool,
    request_in_hand: bool,
) -> Look:
    """Release, or when to look again, for a change set without a request for ``idle`` seconds. ``giving_way``:
    others wait for a slot, or the change set's shard is draining."""
    limit = release_after(quiescent_period, nats_timeout, caught_up=caught_up, giving_way=giving_way)
    if idle < limit:
        # At most a quiet period ahead: pressure may come and shorten the limit (the watchdog then wakes us too).
        return Look(wait=min(limit - idle, quiescent_period) + _SLACK)
    if request_in_hand:
        # Not in a spin until it ends: the processor wakes us when it does.
        return Look(wait=quiescent_period, after_request=True)
    if not caught_up:
        return Look(release=f"no request delivered for {limit:g}s while some were queued")
    return Look(release="quiescent" if limit == quiescent_period else "others wait for a slot")


def may_give_way(idle: float, *, caught_up: bool) -> bool:
    """Whether a change set is idle enough to give way at once should others wait for a slot (or its shard drain):
    caught up, and no request for :data:`PRESSURE_QUIET`. The watchdog asks this first, as it is the cheaper
    question."""
    return caught_up and idle >= PRESSURE_QUIET
