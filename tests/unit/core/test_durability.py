"""What an acknowledged write survives, from sync settings and replicas (rebaser_core.nats.durability): pure logic."""

from __future__ import annotations

import pytest

from rebaser_core.nats.durability import (
    DURABILITY_LEVELS,
    ServerSync,
    assess,
    check_sync,
    describe_sync,
    duration_seconds,
    meets,
    server_sync_from_varz,
)

ALWAYS = ServerSync("n1", always=True, interval=120.0)
LAZY = ServerSync("n1", always=False, interval=120.0)
R1 = {"REQUESTS": 1, "TASKS": 1}
R3 = {"REQUESTS": 3, "TASKS": 3}


@pytest.mark.parametrize(
    ("servers", "replicas", "expected", "level"),
    [
        ([ALWAYS], R1, 1, "power-loss"),
        ([LAZY], R1, 1, "process-crash"),
        ([], R1, 0, "unknown"),
        ([], R1, 1, "unknown"),  # a monitoring URL was given and could not be read
        ([LAZY], R3, 1, "node-loss"),
        ([], R3, 0, "node-loss"),  # replicas alone show a node loss is survived
        ([ALWAYS, ALWAYS, ALWAYS], R3, 3, "power-loss"),
        ([ALWAYS, ALWAYS], R3, 3, "node-loss"),  # one node not read: fsync everywhere is not shown
        ([ALWAYS, LAZY], R1, 2, "process-crash"),  # one lazy server is enough to lose a write
        ([ALWAYS], {"REQUESTS": 3, "TASKS": 1}, 1, "power-loss"),
        ([LAZY], {"REQUESTS": 3, "TASKS": 1}, 1, "process-crash"),  # the weakest stream counts
    ],
)
def test_assess_levels(
    servers: list[ServerSync], replicas: dict[str, int], expected: int, level: str
) -> None:
    result = assess(servers, replicas, expected_servers=expected)
    assert result.level == level
    assert result.survives_power_loss == (level in ("node-loss", "power-loss"))
    assert (result.warning() is None) == result.survives_power_loss


def test_sync_descriptions() -> None:
    assert assess([ALWAYS], R1, expected_servers=1).sync == "always"
    assert assess([LAZY, ServerSync("n2", False, 5.0)], R1, expected_servers=2).sync == "every 120s"
    assert assess([ALWAYS, LAZY], R1, expected_servers=2).sync == "mixed"
    assert assess([], R1).sync == "unknown"
    assert assess([], {}).min_replicas is None


def test_warnings_name_the_cause_and_the_fix() -> None:
    lazy = assess([LAZY], R1, expected_servers=1).warning()
    assert lazy is not None and "every 120s" in lazy and "sync_interval: always" in lazy
    unknown = assess([], R1, expected_servers=1, problems=["http://x/varz: URLError refused"]).warning()
    assert unknown is not None and "URLError refused" in unknown
    assert "--nats-monitoring-url" in (assess([], R1).warning() or "")


def test_as_dict_is_json_shaped() -> None:
    out = assess([ALWAYS], R1, expected_servers=1).as_dict()
    assert out == {
        "level": "power-loss",
        "survives_power_loss": True,
        "sync": "always",
        "min_replicas": 1,
        "servers": [{"server": "n1", "sync": "always"}],
        "replicas": R1,
        "problems": [],
    }


@pytest.mark.parametrize(
    ("value", "canonical"),
    [("always", "always"), (" ALWAYS ", "always"), ("interval", None), ("10s", "10s"), ("1m30s", "1m30s")],
)
def test_check_sync_accepts(value: str, canonical: str | None) -> None:
    assert check_sync(value) == canonical


@pytest.mark.parametrize("value", ["never", "", "10", "0s", "-1s", "5d", "1s2", "always;"])
def test_check_sync_refuses(value: str) -> None:
    with pytest.raises(ValueError, match="sync must be"):
        check_sync(value)


def test_durations_and_descriptions() -> None:
    assert duration_seconds("1m30s") == 90.0
    assert duration_seconds("500ms") == 0.5
    assert describe_sync("always") == "fsync before every acknowledgement"
    assert describe_sync(None) == "fsync every 2m"
    assert describe_sync("1s") == "fsync every 1s"


def test_server_sync_from_varz() -> None:
    varz = {
        "server_name": "a",
        "jetstream": {"config": {"sync_interval": 5_000_000_000, "sync_always": False}},
    }
    assert server_sync_from_varz(varz, "u") == ServerSync("a", always=False, interval=5.0)
    always = {"server_id": "ID", "jetstream": {"config": {"sync_always": True}}}
    assert server_sync_from_varz(always, "u") == ServerSync("ID", always=True, interval=120.0)
    assert server_sync_from_varz({"jetstream": {}}, "u") is None  # no JetStream
    assert server_sync_from_varz({}, "u") is None
    assert server_sync_from_varz({"jetstream": {"config": "x"}}, "u") is None


def test_meets_ranks_unknown_with_process_crash() -> None:
    assert all(meets(level, "none") for level in DURABILITY_LEVELS)
    assert not meets("unknown", "node-loss") and not meets("process-crash", "node-loss")
    assert meets("node-loss", "node-loss") and not meets("node-loss", "power-loss")
    assert meets("power-loss", "power-loss")
