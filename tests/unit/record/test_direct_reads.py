"""Only a stream whose leader alone can answer a direct get is read by one (``rebaser_server.record.direct_reads``)."""

from __future__ import annotations

import pytest

from rebaser_server.record.direct_reads import single_answerer


@pytest.mark.parametrize(
    ("info", "allowed"),
    [
        ({"config": {"allow_direct": True, "num_replicas": 1}}, True),
        ({"config": {"allow_direct": True, "num_replicas": 1}, "alternates": [{"name": "S"}]}, True),
        ({"config": {"allow_direct": True}}, True),  # num_replicas left out: the server's default, one
        ({"config": {"allow_direct": True, "num_replicas": 3}}, False),  # a lagging replica may answer
        ({"config": {"allow_direct": False, "num_replicas": 1}}, False),  # nobody answers a direct get
        ({"config": {"num_replicas": 1}}, False),
        # a mirror made with mirror_direct answers too (listed after the stream itself)
        (
            {
                "config": {"allow_direct": True, "num_replicas": 1},
                "alternates": [{"name": "S"}, {"name": "M"}],
            },
            False,
        ),
        ({"config": {"allow_direct": True, "num_replicas": 1}, "alternates": "S"}, False),
        ({}, False),
        ({"config": None}, False),
    ],
)
def test_single_answerer(info: dict[str, object], allowed: bool) -> None:
    assert single_answerer(info) is allowed
