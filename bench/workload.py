"""The benchmark's load and its results: coroutine clients sending requests and awaiting replies, latency
percentiles, CPU accounting per process group."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from bench.procs import cpu_seconds, machine_busy_seconds

Send = Callable[[int, int], Awaitable[bool]]


@dataclass
class Result:
    impl: str
    daemons: int
    change_sets: int
    requests: int
    errors: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    cold_p50_ms: float
    cold_p99_ms: float
    warm_p99_ms: float
    activations: int
    cpu_us_per_request: dict[str, float] = field(default_factory=dict)
    foreign_load: float = 0.0  # share of the machine's CPUs used by processes outside the benchmark
    ratio: float | None = None
    first_errors: list[str] = field(default_factory=list)
    # With --count-syscalls: nats-server's fsync, fdatasync and pwrite64 calls per request (bench/syscalls.py).
    syscalls_per_request: dict[str, float] = field(default_factory=dict)


@dataclass
class BurstResult:
    impl: str
    change_sets: int
    errors: int
    drain_s: float
    p50_ms: float
    p99_ms: float
    consumers_zero_s: float | None  # after the drain, until the requests stream had no consumer (None: never)
    foreign_load: float = 0.0
    cpu_us_per_change_set: dict[str, int] = field(default_factory=dict)  # during the drain, by process group
    first_errors: list[str] = field(default_factory=list)


@dataclass
class IdleResult:
    """What holding change sets costs while nothing happens: CPU per second per owned, idle change set (the run
    with them owned less the same window with none owned), by process group."""

    impl: str
    change_sets: int
    window_s: float
    owned: int  # task deliveries pending ack at the end of the window: still held
    ack_wait: float  # the failover bound: how long a dead owner's change sets stall
    cpu_us_per_s_per_change_set: dict[str, float] = field(default_factory=dict)
    rss_kb_per_change_set: dict[str, float] = field(
        default_factory=dict
    )  # held less none held, by process group
    # The next request to each change set after the window (8 callers): still held, and after it was let go (a
    # second deployment whose quiescent period ran out first): what releasing idle change sets sooner costs.
    next_held_ms: tuple[float, float] = (float("nan"), float("nan"))  # p50, p99
    next_released_ms: tuple[float, float] = (float("nan"), float("nan"))
    errors: int = 0

    def line(self) -> str:
        cost = ", ".join(
            f"{k} {v:.1f} µs/s ({v / 1e4:.4f} % of a core)"
            for k, v in self.cpu_us_per_s_per_change_set.items()
        )
        memory = ", ".join(f"{k} {v:.1f} kB" for k, v in self.rss_kb_per_change_set.items())
        return (
            f"idle {self.impl}: {self.owned} of {self.change_sets} change sets held over {self.window_s:g}s "
            f"(failover bound {self.ack_wait:g}s), {self.errors} errors; CPU per owned idle change set: {cost}; "
            f"memory per held change set: {memory}; next request p50/p99 ms: held "
            f"{self.next_held_ms[0]:.1f}/{self.next_held_ms[1]:.1f}, let go "
            f"{self.next_released_ms[0]:.1f}/{self.next_released_ms[1]:.1f}"
        )


@dataclass
class DvuResult:
    cost: str  # "natural" or "10x"
    requests: int
    errors: int
    seconds: float
    dvu_runs: int
    state_ok: bool
    detail: str = ""


@dataclass
class Drive:
    latencies: dict[int, float]  # plan index -> seconds, for every request answered successfully
    errors: list[str]
    seconds: float


async def drive(send: Send, plan: list[int], clients: int) -> Drive:
    """``clients`` coroutines share the plan; each sends one request at a time and waits for its reply."""
    latencies: dict[int, float] = {}
    errors: list[str] = []
    todo: Iterator[int] = iter(range(len(plan)))

    async def client() -> None:
        for i in todo:
            start = time.perf_counter()
            try:
                ok = await send(i, plan[i])
                error = "" if ok else "unsuccessful reply"
            except Exception as err:
                error = f"{type(err).__name__}: {err}"
            if error:
                errors.append(error)
            else:
                latencies[i] = time.perf_counter() - start

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(min(clients, len(plan)))))
    return Drive(latencies, errors, time.perf_counter() - start)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


def ms(values: list[float], q: float) -> float:
    return round(percentile(sorted(v * 1000 for v in values), q), 2)


def first_of_each(plan: list[int]) -> set[int]:
    """Indexes of the plan's cold requests: the first request of each change set."""
    seen: set[int] = set()
    cold: set[int] = set()
    for i, c in enumerate(plan):
        if c not in seen:
            seen.add(c)
            cold.add(i)
    return cold


class CpuMeter:
    """CPU seconds of each process group, and of the whole machine, between start and stop."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self.before = {k: sum(map(cpu_seconds, v)) for k, v in pids.items()}
        self.busy_before = machine_busy_seconds()
        self.used: dict[str, float] = {}
        self.foreign = 0.0

    def stop(self, seconds: float) -> None:
        after = {k: sum(map(cpu_seconds, v)) for k, v in self.pids.items()}
        self.used = {k: after[k] - self.before[k] for k in after}
        busy = machine_busy_seconds() - self.busy_before
        self.foreign = round(
            max(0.0, busy - sum(self.used.values())) / (max(seconds, 1e-9) * (os.cpu_count() or 1)), 3
        )
