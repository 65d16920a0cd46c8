"""Prometheus metrics of one daemon, served on ``/metrics`` by the health endpoint (``rebaser_server.ops.http``).

Most numbers already exist: the daemon counts everything in its ``Stats`` and knows its
backlog from :class:`~rebaser_server.ops.health.StatusReporter`.
:class:`~rebaser_server.ops.daemon_metrics.DaemonCollector` reads those at scrape time
instead of mirroring every ``+= 1`` into a second set of counters, so the request path stays as it is. Only what
``Stats`` cannot hold, the two latency histograms, is observed as it happens (:class:`RequestMetrics`).

Each daemon has its own :class:`~prometheus_client.CollectorRegistry`, not the process-wide default: several
daemons in one process (tests, an embedding application) must not clash or mix their numbers.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = [
    "CONTENT_TYPE_LATEST",
    "LightHistogram",
    "RequestMetrics",
    "render",
]

# Applying a request is usually milliseconds; a slow app or a group commit stretches it to seconds.
_PROCESSING_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    120.0,
)
# Waiting in the stream includes waiting for an owner (up to ack_wait after a crash) and for the requests ahead.
_QUEUE_WAIT_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
)


def _le(bound: float) -> str:
    """A bucket's ``le`` label as prometheus_client writes it."""
    text: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
    return text


class LightHistogram(Collector):
    """A histogram exported exactly as prometheus_client's ``Histogram`` exports one (buckets, count, sum,
    created), observed without its cost: ``Histogram.observe`` takes a lock for the sum and another for the
    bucket, found by a Python loop over the bounds. Two observations per request make that a measurable share of a
    daemon's CPU. Observed and scraped on the daemon's one event-loop thread (the health endpoint is aiohttp on
    that loop), so plain integers need no lock."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = (*sorted(buckets), math.inf)
        self._labels = tuple(map(_le, self._bounds))  # each bucket's le label, as the exposition writes it
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._created = time.time()

    def observe(self, amount: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, amount)] += 1  # the first bucket with le >= amount
        self._sum += amount

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation)
        cumulative, buckets = 0, []
        for label, count in zip(self._labels, self._counts, strict=True):
            cumulative += count
            buckets.append((label, cumulative))
        family.add_metric([], buckets, self._sum)
        family.add_sample(f"{self.name}_created", {}, self._created)
        yield family


class RequestMetrics:
    """The daemon's registry, and the histograms observed on the request path."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.processing = LightHistogram(
            "rebaser_request_processing_seconds",
            "Time to handle one request: decide, apply and stage (and commit and reply, unless grouped).",
            buckets=_PROCESSING_BUCKETS,
        )
        self.queue_wait = LightHistogram(
            "rebaser_request_queue_wait_seconds",
            "Time from a request's arrival in the requests stream until a daemon started handling it.",
            buckets=_QUEUE_WAIT_BUCKETS,
        )
        self.registry.register(self.processing)
        self.registry.register(self.queue_wait)
        self._bound = False

    def started(self, stored_at: float | None) -> float:
        """The handling of a request delivery starts: its queue wait observed (from ``stored_at``, when JetStream
        stored it, seconds since the epoch); returns the start for :meth:`ended`, which observes the processing
        time."""
        if stored_at is not None:
            self.queue_wait.observe(max(0.0, time.time() - stored_at))
        return time.monotonic()

    def ended(self, started: float) -> None:
        """The handling that :meth:`started` at ``started`` ended (also when it failed)."""
        self.processing.observe(time.monotonic() - started)

    def bind(self, collector: Collector) -> None:
        """Register the collector of the daemon's counters and gauges
        (:class:`~rebaser_server.ops.daemon_metrics.DaemonCollector`), once however many HTTP servers ask."""
        if not self._bound:
            self.registry.register(collector)
            self._bound = True


def render(metrics: RequestMetrics) -> bytes:
    """The registry in Prometheus text format."""
    return generate_latest(metrics.registry)
