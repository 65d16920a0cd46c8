"""rebaser_server.ops.metrics.LightHistogram exports what prometheus_client's Histogram exports for the same
observations (bucket boundaries included: an observation equal to a bound counts in that bucket)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.exposition import generate_latest

from rebaser_server.ops.metrics import LightHistogram

BUCKETS = (0.001, 0.005, 0.01, 0.1, 1.0, 10.0)


def _without_created(text: bytes) -> list[str]:
    """The exposition but for the created timestamp's value (each histogram records its own creation time)."""
    return [line for line in text.decode().splitlines() if not line.startswith("h_seconds_created ")]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from(BUCKETS), st.floats(min_value=0, max_value=100, allow_nan=False)),
        max_size=30,
    )
)
def test_the_exposition_matches_prometheus_clients(values: list[float]) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    histogram = Histogram("h_seconds", "doc", buckets=BUCKETS, registry=theirs)
    light = LightHistogram("h_seconds", "doc", BUCKETS)
    ours.register(light)
    for value in values:
        histogram.observe(value)
        light.observe(value)
    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(theirs))
    created = [
        line for line in generate_latest(ours).decode().splitlines() if line.startswith("h_seconds_created")
    ]
    assert len(created) == 1  # the sample; its HELP and TYPE lines are compared above with the rest


def test_infinity_goes_to_the_last_bucket() -> None:
    light = LightHistogram("x", "doc", BUCKETS)
    light.observe(math.inf)
    (family,) = light.collect()
    inf = [s for s in family.samples if s.name == "x_bucket" and s.labels["le"] == "+Inf"]
    assert inf[0].value == 1
