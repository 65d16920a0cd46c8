"""The built-in app's limits: refused requests, bounded computed values, bounded batches. Pure, no NATS."""

from __future__ import annotations

import hashlib
from typing import Any, cast

import pytest
from nats.js.errors import NotFoundError

from rebaser_core.api import SetFunction, SetLiteral, Update
from rebaser_core.batches import decode_batch, encode_batch
from rebaser_core.errors import BatchTooLarge, DecodeError, UnprocessableError
from rebaser_core.settings import Settings
from rebaser_server.apps.snapshots.dvu import dependent_values_update
from rebaser_server.apps.snapshots.functions import BUILTIN_FUNCTIONS
from rebaser_server.apps.snapshots.limits import Limits, OverLimit, check_growth, check_updates
from rebaser_server.apps.snapshots.model import Attribute, Snapshot, rebase
from rebaser_server.apps.snapshots.model import _canonical as canonical
from rebaser_server.apps.snapshots.store import SnapshotStore

KIB = 1024


def settle(updates: list[Update], limits: Limits) -> Snapshot:
    rebased = rebase(Snapshot(), updates)
    assert rebased.ok
    return dependent_values_update(rebased.snapshot, BUILTIN_FUNCTIONS, limits)[0]


def test_concat_doublings_stop_at_the_value_limit() -> None:
    # Unbounded, eleven doublings of 100 KB make a 391 MB snapshot.
    updates: list[Update] = [SetLiteral(path="/d0", value="x" * 100 * KIB)]
    updates += [
        SetFunction(path=f"/d{i}", function="concat", args=[f"/d{i - 1}", f"/d{i - 1}"]) for i in range(1, 12)
    ]
    snapshot = settle(updates, Limits(max_value_bytes=1024 * KIB))
    values, errors = snapshot.values(), snapshot.errors()
    assert [len(values[f"/d{i}"]) for i in range(4)] == [100 * KIB * 2**i for i in range(4)]
    assert "over the limit" in errors["/d4"] and "max_value_bytes" in errors["/d4"]
    assert all(f"/d{i}" in errors for i in range(4, 12))
    assert len(snapshot.encode()) < 2 * 1024 * KIB


def test_a_function_is_not_called_on_inputs_over_four_values() -> None:
    calls: list[int] = []

    def count(args: list[object]) -> int:
        calls.append(len(args))
        return len(args)

    updates: list[Update] = [SetLiteral(path="/big", value="x" * 300 * KIB)]
    updates.append(SetFunction(path="/n", function="count", args=["/big"] * 20))
    rebased = rebase(Snapshot(), updates)
    limits = Limits(max_value_bytes=1024 * KIB)
    snapshot = dependent_values_update(rebased.snapshot, {"count": count}, limits)[0]
    assert calls == [] and "inputs of" in snapshot.errors()["/n"]


def test_computed_values_stop_at_the_snapshot_limit() -> None:
    limits = Limits(max_value_bytes=100 * KIB, max_snapshot_bytes=500 * KIB)
    updates: list[Update] = [SetLiteral(path="/c0", value="x" * 60 * KIB)]
    updates += [SetFunction(path=f"/c{i}", function="identity", args=[f"/c{i - 1}"]) for i in range(1, 50)]
    snapshot = settle(updates, limits)
    copied = [p for p, v in snapshot.values().items() if v is not None]
    assert 5 <= len(copied) <= 8
    first = len(copied)
    assert snapshot.errors()[f"/c{first}"] == "over max_snapshot_bytes"
    assert snapshot.errors()["/c49"] == "input /c48 has an error: over max_snapshot_bytes"
    assert len(snapshot.encode()) <= limits.max_snapshot_bytes + 50 * 300
    # The caller may pass the size it already knows instead of having it measured again.
    rebased = rebase(Snapshot(), updates).snapshot
    size = len(rebased.encode())
    assert dependent_values_update(rebased, BUILTIN_FUNCTIONS, limits, encoded_size=size)[0] == snapshot


def test_without_limits_nothing_is_cut() -> None:
    updates: list[Update] = [
        SetLiteral(path="/a", value="x" * 10),
        SetFunction(path="/b", function="concat", args=["/a", "/a"]),
    ]
    assert settle(updates, Limits())
    assert (
        dependent_values_update(rebase(Snapshot(), updates).snapshot, BUILTIN_FUNCTIONS)[0].values()["/b"]
        == "x" * 20
    )


def test_requests_over_the_limits_are_refused_as_unprocessable() -> None:
    limits = Limits(max_updates=3, max_value_bytes=KIB)
    with pytest.raises(OverLimit, match="max_updates_per_request"):
        check_updates([SetLiteral(path=f"/a{i}", value=i) for i in range(4)], limits)
    with pytest.raises(OverLimit, match="max_value_bytes") as refused:
        check_updates([SetLiteral(path="/a", value={"k": "x" * KIB})], limits)
    assert isinstance(refused.value, UnprocessableError) and refused.value.maximum == KIB
    with pytest.raises(OverLimit, match="expected_version"):
        check_updates([SetLiteral(path="/a", value=1, expected_version="v" * 257)], limits)
    check_updates([SetLiteral(path=f"/a{i}", value="x" * 1000) for i in range(3)], limits)


def test_a_snapshot_may_not_grow_over_its_limits_but_may_shrink() -> None:
    limits = Limits(max_attributes=10, max_snapshot_bytes=1000)
    check_growth((5, 100), (10, 1000), limits)
    with pytest.raises(OverLimit, match="max_snapshot_attributes"):
        check_growth((10, 100), (11, 100), limits)
    with pytest.raises(OverLimit, match="max_snapshot_bytes"):
        check_growth((5, 900), (5, 1001), limits)
    check_growth(
        (20, 5000), (19, 4000), limits
    )  # limits lowered below an existing snapshot: removing still works


def test_snapshot_encoding_is_canonical_json_built_piecewise() -> None:
    snapshot = Snapshot(
        {
            "/b": Attribute(value={"z": 1, "a": ["é", None, 1.5]}),
            "/a": Attribute(function="sum", args=("/b",), stale=True, error="e"),
        },
        frozenset({"/b", "/a"}),
    )
    assert snapshot.encode() == canonical(snapshot.to_json())
    assert Snapshot().encode() == canonical(Snapshot().to_json())
    assert Snapshot.decode(snapshot.encode()) == snapshot


# -- stored batches ---------------------------------------------------------------------------------------------


def test_the_client_refuses_to_store_a_batch_over_the_limits() -> None:
    updates: list[Update] = [SetLiteral(path=f"/a{i}", value=i) for i in range(11)]
    with pytest.raises(BatchTooLarge) as refused:
        encode_batch(updates, max_updates=10)
    assert refused.value.limit == "updates" and refused.value.size == 11
    with pytest.raises(BatchTooLarge) as refused:
        encode_batch(updates, max_bytes=100)
    assert refused.value.limit == "bytes" and refused.value.maximum == 100
    with pytest.raises(BatchTooLarge):
        encode_batch([SetLiteral(path="/a", value=1)] * 100_001)


def test_the_daemon_counts_a_stored_batch_before_validating_it() -> None:
    address, data = encode_batch([SetLiteral(path=f"/a{i}", value=i) for i in range(11)])
    assert len(decode_batch(address, data, max_updates=11)) == 11
    with pytest.raises(DecodeError, match="11 updates, over the limit of 10"):
        decode_batch(address, data, max_updates=10)
    junk = b'{"kind":"inline","updates":[' + b",".join([b'{"op":"bogus"}'] * 20) + b"]}"
    with pytest.raises(DecodeError, match="over the limit"):
        decode_batch(hashlib.sha256(junk).hexdigest(), junk, max_updates=10)


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'{"kind":"inline"}',
        b'{"kind":"stored","updates":[]}',
        b'{"updates":[],"x":1}',
        b"[" * 100_000,
        b"NaN",
    ],
)
def test_a_malformed_stored_batch_is_a_decode_error(body: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_batch(hashlib.sha256(body).hexdigest(), body)


# -- the snapshot cache ---------------------------------------------------------------------------------------


class _FakeObjectStore:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    async def get_info(self, name: str) -> None:
        if name not in self.objects:
            raise NotFoundError

    async def put(self, name: str, data: bytes) -> None:
        self.objects[name] = data


async def test_the_snapshot_cache_is_bounded_in_bytes() -> None:
    store = SnapshotStore(cast(Any, None), Settings(), cache_bytes=10 * KIB)
    store._snapshots = cast(Any, _FakeObjectStore())
    addresses = [await store.put(Snapshot({"/a": Attribute(value=str(i) * 3 * KIB)})) for i in range(10)]
    cached = [a for a in addresses if store.size(a) is not None]
    assert cached == addresses[-3:]  # about 3 KiB each: the newest three fit in 10 KiB
    huge = await store.put(Snapshot({"/a": Attribute(value="h" * 20 * KIB)}))
    assert store.size(huge) is not None and all(store.size(a) is None for a in addresses)
