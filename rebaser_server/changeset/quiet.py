"""When an owned change set lets go: the quiet rule, as pure logic (no NATS, no clock of its own).

The processor asks :func:`look` each time it wakes up while it owns a change set: release now, or look again
when? The watchdog asks :func:`may_give_way` on every pass, to wake the processor early when others wait for a
slot, and :class:`GiveWay` whether its workspace is one that gives way now.

- A change set whose consumer has **caught up** (nothing queued) lets go after ``quiescent_period`` without a
  request; while others wait for a slot (the daemon is full) or its shard moves away (a layout change drains it),
  after :data:`PRESSURE_QUIET` instead.
- Before its consumer has caught up, a gap is slow delivery (a busy machine, flow control), not a quiet change set:
  releasing then would only cost a re-take. It gives up only after ``max(2 x quiescent_period, nats_timeout)`` (a
  stalled consumer; the release check hands the queued requests to a fresh activation).
- A change set idle long enough but with a request in hand (its step waits for something) does not let go under
  it: it looks again when that request ends.
- Under pressure the busiest workspaces give way first (:class:`GiveWay`): for :data:`BUSIEST_FIRST` seconds only
  the idle change sets of the workspaces owning at least an even part of the daemon do; a small workspace's idle
  change set stays, so a flood that fills the daemon makes room from its own change sets. Should that free no slot
  (the busiest have none idle), any idle change set gives way after that, so nobody waits a whole quiet period.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rebaser_core.ids import WorkspacePk

__all__ = [
    "BUSIEST_FIRST",
    "FAIR_PRESSURE_QUIET",
    "PRESSURE_QUIET",
    "GiveWay",
    "Look",
    "busiest",
    "look",
    "may_give_way",
    "release_after",
]

PRESSURE_QUIET = 1.0
"""Seconds without a request after which a caught-up change set gives way to others waiting for a slot."""

FAIR_PRESSURE_QUIET = 0.05
"""The same with the fair intake, which knows a task waits (it was published, or its workspace's queue said so)
rather than guessing from a count read once a second: a newcomer waits a few tens of ms for a slot, not a second.
A change set let go this early and asked for again costs one activation (about 2.5 ms of CPU), the price of the
newcomer's latency."""

BUSIEST_FIRST = 3.0
"""Seconds of pressure (no slot freed meanwhile) during which only the busiest workspaces' idle change sets give way.
Long enough for them to be woken (the watchdog, every ``progress_period``) and to let go (a few round trips); any
idle change set gives way after it."""

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
    quiescent_period: float,
    nats_timeout: float,
    *,
    caught_up: bool,
    giving_way: bool,
    pressure_quiet: float = PRESSURE_QUIET,
) -> float:
    """How long without a request before the change set lets go (see the module docstring)."""
    if not caught_up:
        return max(2 * quiescent_period, nats_timeout)
    return min(quiescent_period, pressure_quiet) if giving_way else quiescent_period


def look(
    idle: float,
    *,
    quiescent_period: float,
    nats_timeout: float,
    caught_up: bool,
    giving_way: bool,
    request_in_hand: bool,
    pressure_quiet: float = PRESSURE_QUIET,
) -> Look:
    """Release, or when to look again, for a change set without a request for ``idle`` seconds. ``giving_way``:
    others wait for a slot, or the change set's shard is draining."""
    limit = release_after(
        quiescent_period,
        nats_timeout,
        caught_up=caught_up,
        giving_way=giving_way,
        pressure_quiet=pressure_quiet,
    )
    if idle < limit:
        # At most a quiet period ahead: pressure may come and shorten the limit (the watchdog then wakes us too).
        return Look(wait=min(limit - idle, quiescent_period) + _SLACK)
    if request_in_hand:
        # Not in a spin until it ends: the processor wakes us when it does.
        return Look(wait=quiescent_period, after_request=True)
    if not caught_up:
        return Look(release=f"no request delivered for {limit:g}s while some were queued")
    return Look(release="quiescent" if limit == quiescent_period else "others wait for a slot")


def may_give_way(idle: float, *, caught_up: bool, pressure_quiet: float = PRESSURE_QUIET) -> bool:
    """Whether a change set is idle enough to give way at once should others wait for a slot (or its shard drain):
    caught up, and no request for :data:`PRESSURE_QUIET`. The watchdog asks this first, as it is the cheaper
    question."""
    return caught_up and idle >= pressure_quiet


def busiest(owned: Mapping[WorkspacePk, int]) -> frozenset[WorkspacePk]:
    """The workspaces whose idle change sets give way first: those owning at least an even part of what this daemon
    owns (the most owned always among them; all of them when every workspace owns as many)."""
    total, workspaces = sum(owned.values()), len(owned)
    return frozenset(wk for wk, n in owned.items() if n * workspaces >= total)


class GiveWay:
    """Who gives way while this daemon is full and others wait for a slot: set by the daemon's pull loop (at most
    about once a second, one pass over the workspaces owned), read by each owned change set's watchdog (one set
    lookup: no scan of the change sets, however many are owned)."""

    __slots__ = ("_first", "_since", "busiest_only", "quiet")

    def __init__(self) -> None:
        self._since: float | None = None  # when the pressure began (monotonic); None: no pressure
        self._first: frozenset[WorkspacePk] | None = None  # who gives way now; None: any workspace
        # How long a caught-up change set is idle before it gives way (the intake's: PRESSURE_QUIET or, with the
        # fair intake, FAIR_PRESSURE_QUIET).
        self.quiet = PRESSURE_QUIET
        # The fair intake: only the busiest workspaces ever give way (a small workspace's idle change set stays even
        # if the busiest have none idle: the newcomer then waits for the busiest to go quiet, not a whole quiet
        # period, as the fair intake's give way is 50 ms of quiet).
        self.busiest_only = False

    @property
    def pressure(self) -> bool:
        return self._since is not None

    def press(self, owned: Mapping[WorkspacePk, int], now: float) -> None:
        """Others still wait for a slot, and none was freed since the last look; ``owned``: change sets owned here
        per workspace."""
        if self._since is None:
            self._since = now
        self._first = busiest(owned) if self.busiest_only or now - self._since < BUSIEST_FIRST else None

    def ease(self) -> None:
        """A slot is free, or nobody waits: nothing gives way (a new pressure starts with the busiest again)."""
        self._since, self._first = None, None

    def covers(self, workspace: WorkspacePk) -> bool:
        """Whether an idle change set of ``workspace`` gives way now."""
        return self._since is not None and (self._first is None or workspace in self._first)
