"""The built-in snapshot application through the daemon: fork, rebase, conflicts, apply-onto-HEAD, DVU, batches."""

from __future__ import annotations

import asyncio

import nats
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NatsClient

from rebaser_client import ChangeSetId, RebaserClient, Remove, SetFunction, SetLiteral, WorkspacePk
from rebaser_core.api import GetChangeSetResponse, Update
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.testing import wait_for
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.apps.snapshots.dvu import dependent_values_update
from rebaser_server.apps.snapshots.functions import BUILTIN_FUNCTIONS
from rebaser_server.apps.snapshots.model import Snapshot, rebase
from rebaser_server.testing import fast_settings, running_daemon


async def settled(client: RebaserClient, wk: WorkspacePk, cs: ChangeSetId) -> GetChangeSetResponse:
    """The change set once no dependent values update is pending."""

    async def get() -> GetChangeSetResponse | None:
        response = await client.get_change_set(wk, cs)
        return None if response.dvu_pending else response

    result: GetChangeSetResponse = await wait_for(get, timeout=20, message="DVU finished")
    return result


def serial(batches: list[list[Update]]) -> dict[str, object]:
    """The same batches applied in memory, one after the other, then dependent values recomputed."""
    snapshot = Snapshot()
    for batch in batches:
        rebased = rebase(snapshot, batch)
        if rebased.ok:
            snapshot = rebased.snapshot
    return dependent_values_update(snapshot, BUILTIN_FUNCTIONS)[0].values()


async def test_fork_update_conflict_and_apply_onto_head(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), SnapshotApp()):
        wk, head, feature = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
        setup = [
            SetLiteral(path="/web/host", value="web"),
            SetLiteral(path="/web/port", value=80),
            SetFunction(path="/web/url", function="format", args=["/fmt", "/web/host", "/web/port"]),
            SetLiteral(path="/fmt", value="http://{}:{}"),
        ]
        assert (await client.enqueue_updates_with_reply(wk, head, setup)).ok
        base = await settled(client, wk, head)
        assert base.values["/web/url"] == "http://web:80"

        fork = await client.fork_change_set(wk, feature, head)
        assert fork.snapshot_address == base.snapshot_address
        port_version = base.versions["/web/port"]
        changed = await client.enqueue_updates_with_reply(
            wk, feature, [SetLiteral(path="/web/port", value=8080, expected_version=port_version)]
        )
        assert changed.ok
        feature_state = await settled(client, wk, feature)
        assert feature_state.values["/web/url"] == "http://web:8080" and feature_state.forked_from == head
        assert (await client.get_change_set(wk, head, "/web/port")).values == {"/web/port": 80}

        # A batch computed against the old version conflicts and applies nothing (the whole batch).
        stale = await client.enqueue_updates_with_reply(
            wk,
            feature,
            [
                SetLiteral(path="/web/host", value="new"),
                SetLiteral(path="/web/port", value=1, expected_version=port_version),
            ],
        )
        assert stale.status.kind == "conflicts"
        assert [c.path for c in stale.status.conflicts] == ["/web/port"]
        assert (await client.get_change_set(wk, feature)).snapshot_address == feature_state.snapshot_address

        onto_head = await client.enqueue_updates_from_change_set_with_reply(wk, head, feature)
        assert onto_head.ok
        head_state = await settled(client, wk, head)
        assert head_state.values["/web/url"] == "http://web:8080"


async def test_apply_onto_head_conflicts_when_head_changed_the_same_path(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), SnapshotApp()):
        wk, head, feature = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
        assert (await client.enqueue_updates_with_reply(wk, head, [SetLiteral(path="/a", value=1)])).ok
        await client.fork_change_set(wk, feature, head)
        assert (await client.enqueue_updates_with_reply(wk, feature, [SetLiteral(path="/a", value=2)])).ok
        assert (await client.enqueue_updates_with_reply(wk, head, [SetLiteral(path="/a", value=3)])).ok
        response = await client.enqueue_updates_from_change_set_with_reply(wk, head, feature)
        assert response.status.kind == "conflicts" and response.status.conflicts[0].path == "/a"
        assert (await client.get_change_set(wk, head)).values == {"/a": 3}


async def test_cycles_and_function_errors_are_error_values(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), SnapshotApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        batch: list[Update] = [
            SetFunction(path="/x", function="identity", args=["/y"]),
            SetFunction(path="/y", function="identity", args=["/x"]),
            SetLiteral(path="/s", value="text"),
            SetFunction(path="/n", function="sum", args=["/s"]),
        ]
        # (An unknown function is refused with the request instead: test_first_contact_wire.)
        assert (await client.enqueue_updates_with_reply(wk, cs, batch)).ok
        state = await settled(client, wk, cs)
        assert set(state.errors) == {"/x", "/y", "/n"}
        assert "cycle" in state.errors["/x"] and "sum failed" in state.errors["/n"]


async def test_stored_batches(nc: NatsClient, client: RebaserClient, subject_prefix: str) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), SnapshotApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        big = [SetLiteral(path=f"/items/{i}", value={"n": i, "pad": "x" * 100}) for i in range(2000)]
        stored = await client.store_batch(wk, big)
        response = await client.enqueue_updates_with_reply(wk, cs, stored)
        assert response.ok and response.status.updates_performed == 2000
        assert (await client.get_change_set(wk, cs, "/items/1999")).values["/items/1999"]["n"] == 1999
        missing = await client.enqueue_updates_with_reply(wk, cs, "0" * 64)
        assert missing.status.kind == "error" and "does not exist" in missing.status.message


async def test_burst_of_1000_requests_on_one_change_set(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    await ensure_streams(nc.jetstream(), settings)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    # Every batch touches its own path, so the final state does not depend on the order in which the
    # concurrent publishes reach the stream, and all 1,000 can be in flight at once.
    batches: list[list[Update]] = [
        [SetFunction(path="/total", function="sum", args=[f"/n{i}" for i in range(0, 999, 37)])]
    ]
    batches += [[SetLiteral(path=f"/n{i}", value=i)] for i in range(999)]
    calls = [asyncio.create_task(client.enqueue_updates_with_reply(wk, cs, b, timeout=60)) for b in batches]
    try:
        # All 1,000 are stored before the daemon starts, so it finds them queued, which is what group commits are
        # for. Started first, on a loaded machine it could keep up with the publishes one request at a time.
        async def stored() -> bool:
            info = await nc.jetstream().stream_info(settings.subjects.requests_stream)
            return info.state.messages == len(batches)

        await wait_for(stored, timeout=60, message="the burst stored")
        async with running_daemon(nc, settings, SnapshotApp()) as daemon:
            replies = await asyncio.gather(*calls)
            assert all(r.ok for r in replies)
            state = await settled(client, wk, cs)
            assert state.values == serial(batches)
            assert daemon.stats.requests_applied == 1000
            assert daemon.stats.request_commits < 1000  # requests that queued up were committed in groups
            print(
                f"\nburst of 1000 requests: {daemon.stats.dvu_runs} DVU runs, "
                f"{daemon.stats.request_commits} commits"
            )
    finally:
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)


paths = st.sampled_from(["/a", "/b", "/c", "/d"])
updates = st.one_of(
    st.builds(SetLiteral, path=paths, value=st.integers(-100, 100) | st.text(max_size=3)),
    st.builds(Remove, path=paths),
    st.builds(
        SetFunction,
        path=paths,
        function=st.sampled_from(["sum", "concat", "max", "identity"]),
        args=st.lists(paths, min_size=1, max_size=3),
    ),
)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(batches=st.lists(st.lists(updates, min_size=1, max_size=4), min_size=1, max_size=8))
def test_random_batches_through_the_daemon_match_serial_application(
    nats_url: str, batches: list[list[Update]]
) -> None:
    async def scenario() -> dict[str, object]:
        import secrets

        prefix = "h" + secrets.token_hex(5)
        conn = await nats.connect(nats_url)
        try:
            async with (
                running_daemon(conn, fast_settings(prefix), SnapshotApp()),
                RebaserClient(conn, prefix=prefix) as client,
            ):
                wk, cs = WorkspacePk.new(), ChangeSetId.new()
                for batch in batches[
                    :-1
                ]:  # each publish is acknowledged before the next: stream order = list order
                    await client.enqueue_updates(wk, cs, batch)
                assert (await client.enqueue_updates_with_reply(wk, cs, batches[-1], timeout=20)).ok
                return (await settled(client, wk, cs)).values
        finally:
            await conn.close()

    assert asyncio.run(scenario()) == serial(batches)
