"""The shard layout: the stable shard function, pinned assignment, the KV value, per-shard names."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from rebaser_core.errors import InvalidSubject, LayoutMismatch
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.layout import LANES, MAX_LANES, Layout, ordinal_from_hostname, pinned_shards, shard_of
from rebaser_core.subjects import Subjects

WK = WorkspacePk("01HZZZZZZZZZZZZZZZZZZZZZZZ")
CS = ChangeSetId("01J00000000000000000000000")


def test_shard_of_is_blake2b_64_of_workspace_dot_change_set() -> None:
    # Pinned value: any client in any language computes the same (blake2b, 8-byte digest, big endian, mod N).
    digest = hashlib.blake2b(f"{WK}.{CS}".encode(), digest_size=8).digest()
    expected = int.from_bytes(digest, "big")
    for n in (2, 3, 6, 64):
        assert shard_of(WK, CS, n) == expected % n
    assert shard_of(WK, CS, 1) == 0
    assert shard_of(str(WK).lower(), str(CS).lower(), 6) == shard_of(WK, CS, 6)  # canonical form is hashed


def test_shard_of_spreads_change_sets() -> None:
    wk = WorkspacePk.new()
    counts = Counter(shard_of(wk, ChangeSetId.new(), 6) for _ in range(6000))
    assert set(counts) == set(range(6))
    assert min(counts.values()) > 800  # about 1000 each


def test_pinned_assignment_is_round_robin_and_refuses_more_daemons_than_streams() -> None:
    assert pinned_shards(0, 2, 6) == [0, 2, 4]
    assert pinned_shards(1, 2, 6) == [1, 3, 5]
    assert pinned_shards(2, 3, 3) == [2]
    with pytest.raises(LayoutMismatch, match="4 daemons but only 3 streams"):
        pinned_shards(0, 4, 3)
    with pytest.raises(LayoutMismatch, match=r"outside 0\.\.1"):
        pinned_shards(2, 2, 6)


def test_ordinal_from_hostname() -> None:
    assert ordinal_from_hostname("rebaser-2") == 2
    assert ordinal_from_hostname("rebaser-12.rebaser.default.svc") == 12
    assert ordinal_from_hostname("rebaser") is None


def test_layout_roundtrip_and_migration() -> None:
    layout = Layout(streams=3, mode="pinned")
    assert Layout.decode(layout.encode()) == layout
    moved = layout.changed_to(6)
    assert (moved.streams, moved.previous, moved.epoch, moved.migrating) == (6, 3, 1, True)
    assert moved.shards == range(6)
    old = moved.old_shard_of(WK, CS)
    assert old == (None if shard_of(WK, CS, 3) == shard_of(WK, CS, 6) else shard_of(WK, CS, 3))
    down = Layout(streams=6).changed_to(2)
    assert down.shards == range(6)  # the removed shards are served until they drain
    assert down.settled().shards == range(2) and not down.settled().migrating
    with pytest.raises(LayoutMismatch, match="unreadable"):
        Layout.decode(b'{"streams": "x"}')
    with pytest.raises(ValueError, match="between 1 and 64"):
        Layout(streams=0)


def test_flags_must_agree_with_the_layout() -> None:
    layout = Layout(streams=3)
    layout.check_flags(None, None, "x")
    layout.check_flags(3, "shared", "x")
    with pytest.raises(LayoutMismatch, match="--streams 2 but the cluster's layout has 3"):
        layout.check_flags(2, None, "this daemon")
    with pytest.raises(LayoutMismatch, match="--assignment pinned"):
        layout.check_flags(None, "pinned", "this daemon")


def test_shard_zero_keeps_todays_names() -> None:
    for prefix in (None, "P"):
        plain, zero = Subjects(prefix), Subjects(prefix).for_shard(0)
        assert zero == plain
        assert plain.requests_stream.endswith("REBASER_REQUESTS")
        assert plain.requests(WK, CS).endswith(f"rebaser.requests.{WK}.{CS}")
        assert plain.task(WK, CS).endswith(f"rebaser.tasks.{WK}.{CS}.process")


def test_shard_names_and_parsing() -> None:
    s = Subjects("P").for_shard(4)
    assert (s.requests_stream, s.tasks_stream, s.tasks_consumer) == (
        "P_REBASER_REQUESTS_4",
        "P_REBASER_TASKS_4",
        "rebaser-tasks",
    )
    assert s.requests(WK, CS) == f"P.rebaser.requests.4.{WK}.{CS}"
    assert s.task(WK, CS) == f"P.rebaser.tasks.4.{WK}.{CS}.process"
    assert s.requests_stream_subject == "P.rebaser.requests.4.*.*"
    assert s.tasks_filter == "P.rebaser.tasks.4.*.*.*"
    assert s.parse_task(s.task(WK, CS)).change_set_id == CS
    base = Subjects("P")
    assert base.shard_of_subject(s.requests(WK, CS)) == 4
    assert base.shard_of_subject(s.task(WK, CS)) == 4
    assert base.shard_of_subject(base.task(WK, CS)) == 0
    assert base.parse_any_requests(s.requests(WK, CS)).workspace_id == WK
    with pytest.raises(InvalidSubject):
        Subjects("P").parse_requests(s.requests(WK, CS))  # shard 0 does not parse shard 4's subjects
    # Dead letters, records and queries are shared by all shards.
    assert s.dead_letter_stream == base.dead_letter_stream and s.api("get", WK, CS) == base.api("get", WK, CS)


def test_a_spooled_request_is_rerouted_by_the_current_layout() -> None:
    from rebaser_client._routing import Router

    router = Router(None, Subjects("P"))  # type: ignore[arg-type]  # reroute needs no connection
    router.layout = Layout(streams=6)
    old = Subjects("P").requests(WK, CS)  # stored while the deployment had one stream
    subject, headers = router.reroute(old, {"Nats-Expected-Stream": "P_REBASER_REQUESTS", "Nats-Msg-Id": "x"})
    shard = shard_of(WK, CS, 6)
    assert subject == Subjects("P").for_shard(shard).requests(WK, CS)
    assert headers == {
        "Nats-Expected-Stream": Subjects("P").for_shard(shard).requests_stream,
        "Nats-Msg-Id": "x",
    }


async def test_a_router_that_never_read_the_layout_routes_nothing() -> None:
    from types import SimpleNamespace

    from rebaser_client._routing import Router
    from rebaser_core.errors import RebaserUnavailable

    offline = SimpleNamespace(is_connected=False)  # started while NATS is down: the layout cannot be read
    router = Router(offline, Subjects("P"))  # type: ignore[arg-type]
    await router.start()
    try:
        assert not router.known
        with pytest.raises(RebaserUnavailable, match="shard layout has not been read"):
            router.reroute(Subjects("P").requests(WK, CS), {})  # a spooled request waits: no guess at shard 0
        router.layout = Layout(streams=6)  # read at last
        assert router.reroute(Subjects("P").requests(WK, CS), {})[0] == Subjects("P").for_shard(
            shard_of(WK, CS, 6)
        ).requests(WK, CS)
    finally:
        await router.close()


async def test_an_admin_layout_read_that_times_out_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import nats.errors

    from rebaser_client import _routing
    from rebaser_core.errors import RebaserUnavailable

    async def no_answer(*_args: object, **_kwargs: object) -> None:
        raise nats.errors.TimeoutError

    monkeypatch.setattr(_routing, "fetch_layout", no_answer)
    # A RebaserError is what the admin CLI prints as one line; a bare TimeoutError would be a traceback.
    with pytest.raises(RebaserUnavailable, match="reading the shard layout failed"):
        await _routing.routed(None, Subjects("P"), WK, CS)  # type: ignore[arg-type]


def test_the_lane_count_is_the_layout_s_and_an_older_layout_has_32() -> None:
    layout = Layout(intake="lanes", lane_count=4)
    assert layout.lanes == 4 and Layout.decode(layout.encode()) == layout
    assert Layout(intake="fair", lane_count=4).lanes == 0  # stored by lane only with the lanes intake
    assert Layout.decode(b'{"streams":1,"intake":"lanes"}').lanes == LANES
    for count in (0, MAX_LANES + 1):
        with pytest.raises(ValueError, match="lanes must be between"):
            Layout(intake="lanes", lane_count=count)


def test_the_lane_count_is_read_back_from_the_tasks_stream_s_transform() -> None:
    subjects = Subjects("p")
    for count in (1, 4, 32, MAX_LANES):
        assert Subjects.transform_lanes(subjects.for_shard(1).tasks_transform(count)[1]) == count
    assert Subjects.transform_lanes("p.tasks.{{wildcard(1)}}") is None
