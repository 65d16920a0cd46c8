"""Back-pressure without a server: refusals classified by nats-server's description, and the spool's bounds,
order, persistence and exclusivity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rebaser_client import SpoolConfig, SpoolError
from rebaser_client._spool import Spool
from rebaser_core.errors import RebaserBusy, RebaserRefused, RebaserUnavailable
from rebaser_core.nats.tasks import CHANGE_SET_FULL_RETRY_AFTER, STREAM_FULL_RETRY_AFTER, check_pub_ack
from rebaser_core.settings import Settings


def refusal(description: str, err_code: int = 10077, code: int = 503) -> bytes:
    return json.dumps(
        {"error": {"code": code, "err_code": err_code, "description": description}, "stream": "S", "seq": 0}
    ).encode()


@pytest.mark.parametrize(
    ("description", "limit", "retry_after", "says"),
    [
        (
            "maximum messages per subject exceeded",
            "change_set",
            CHANGE_SET_FULL_RETRY_AFTER,
            "change set's backlog",
        ),
        ("maximum messages exceeded", "stream_messages", STREAM_FULL_RETRY_AFTER, "requests_max_msgs"),
        ("maximum bytes exceeded", "stream_bytes", STREAM_FULL_RETRY_AFTER, "requests_max_bytes"),
        ("some future limit", "stream", STREAM_FULL_RETRY_AFTER, "a stream limit was reached"),
    ],
)
def test_busy_names_the_limit(description: str, limit: str, retry_after: float, says: str) -> None:
    with pytest.raises(RebaserBusy) as refused:
        check_pub_ack(refusal(description), "rebaser.requests.W.C")
    assert refused.value.limit == limit and refused.value.retry_after == retry_after
    assert says in str(refused.value) and description in str(refused.value)


def test_other_refusals() -> None:
    assert check_pub_ack(b'{"stream":"S","seq":7}', "s") == 7
    assert check_pub_ack(refusal("maximum messages per subject exceeded"), "s", allow=(10077,)) is None
    with pytest.raises(RebaserRefused) as too_big:
        check_pub_ack(refusal("message size exceeds maximum allowed", 10054, 400), "s")
    assert not isinstance(too_big.value, RebaserBusy)
    with pytest.raises(RebaserUnavailable):
        check_pub_ack(refusal("JetStream system temporarily unavailable", 10008), "s")


def test_readiness_settings() -> None:
    s = Settings()
    assert s.ready_max_backlog == 10_000 and s.ready_max_disconnected == 30.0
    assert Settings.from_env({"REBASER_READY_MAX_BACKLOG": "-1"}).ready_max_backlog == -1


async def test_spool_bounds_order_and_persistence(tmp_path: Path) -> None:
    config = SpoolConfig(tmp_path / "spool.db", max_requests=3, max_bytes=10_000)
    spool = Spool(config)
    await spool.open()
    for i in range(3):
        await spool.add(f"r{i}", "a" if i != 1 else "b", {"Nats-Msg-Id": f"r{i}"}, b"x" * 10)
    with pytest.raises(RebaserBusy) as full:
        await spool.add("r3", "c", {}, b"")
    assert full.value.limit == "spool"
    assert spool.holds("a") and spool.holds("b") and not spool.holds("c")
    head = await spool.head(10)
    assert [e.request_id for e in head] == ["r0", "r1", "r2"]
    assert head[0].headers == {"Nats-Msg-Id": "r0"} and head[0].body == b"x" * 10
    await spool.remove(head[1])
    assert not spool.holds("b") and spool.size == 2
    size = spool.size_bytes
    await spool.close()

    reopened = Spool(config)  # a new client on the same file sees what the old one left, in order
    await reopened.open()
    assert (reopened.size, reopened.size_bytes) == (2, size)
    assert [e.request_id for e in await reopened.head(10)] == ["r0", "r2"]
    with pytest.raises(SpoolError, match="in use"):
        await Spool(config).open()
    await reopened.close()


async def test_spool_byte_bound(tmp_path: Path) -> None:
    spool = Spool(SpoolConfig(tmp_path / "spool.db", max_bytes=100))
    await spool.open()
    await spool.add("r0", "a", {}, b"x" * 50)
    with pytest.raises(RebaserBusy, match="spool is full"):
        await spool.add("r1", "a", {}, b"x" * 50)
    await spool.close()


def test_spool_config_is_checked() -> None:
    with pytest.raises(ValueError):
        SpoolConfig("x", max_requests=0)
