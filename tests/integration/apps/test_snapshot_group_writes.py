"""The built-in app writes one snapshot object per group commit, and always before the record that points to it; a
small snapshot is kept in the record instead, and read from there by any daemon."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from rebaser_client import ChangeSetId, RebaserClient, SetFunction, SetLiteral, WorkspacePk
from rebaser_core.api import GetChangeSetResponse
from rebaser_core.testing import wait_for
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.apps.snapshots.app import EMPTY
from rebaser_server.record.handle import ChangeSetHandle
from rebaser_server.record.model import ChangeSetRecord
from rebaser_server.testing import CheckpointGate, fast_settings, running_daemon


def count_object_puts(app: SnapshotApp, fail_first: int = 0) -> list[str]:
    """Wrap the app's snapshot object store: every object written (its name) is appended to the returned list;
    the first ``fail_first`` writes fail instead (as an unreachable object store would)."""
    objects: Any = app.store._writer
    put: Callable[..., Awaitable[Any]] = objects.put_once
    written: list[str] = []
    failures = [fail_first]

    async def counted(name: str, data: bytes, *args: Any, **kwargs: Any) -> Any:
        if failures[0] > 0:
            failures[0] -= 1
            raise TimeoutError("object store unreachable (test)")
        result = await put(name, data, *args, **kwargs)
        written.append(name)
        return result

    objects.put_once = counted
    return written


async def settled(client: RebaserClient, wk: WorkspacePk, cs: ChangeSetId, n: int) -> GetChangeSetResponse:
    async def get() -> GetChangeSetResponse | None:
        response = await client.get_change_set(wk, cs)
        return None if response.dvu_pending or len(response.values) < n else response

    result: GetChangeSetResponse = await wait_for(get, timeout=20, message="all requests applied, DVU done")
    return result


async def test_a_group_of_requests_writes_one_snapshot(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    n = 10
    app = SnapshotApp()
    # Held right after the change set is acquired, so all n requests are queued when it starts consuming: one group.
    gate = CheckpointGate("acquired")
    settings = fast_settings(subject_prefix, snapshot_inline_bytes=0)  # every snapshot to the object store
    async with running_daemon(nc, settings, app, hooks=gate) as daemon:
        written = count_object_puts(app)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        for i in range(n):
            await client.enqueue_updates(wk, cs, [SetLiteral(path=f"/n{i}", value=i)])
        await gate.wait_reached()
        gate.release()
        state = await settled(client, wk, cs, n)
        assert state.values == {f"/n{i}": i for i in range(n)}
        assert daemon.stats.requests_applied == n
        # The queued requests were committed in groups (the first may be committed alone, as it arrives first).
        commits = daemon.stats.request_commits
        assert commits <= 2
        # One object per commit and per DVU run, instead of one per request.
        assert len(written) == commits + daemon.stats.dvu_runs, written
        assert state.snapshot_address == written[-1]


async def test_a_failed_snapshot_write_commits_nothing_and_the_request_is_retried(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = SnapshotApp()
    committed: list[str] = []
    commit = ChangeSetHandle.commit

    async def checked_commit(self: ChangeSetHandle, record: ChangeSetRecord) -> None:
        # The guarantee: a record is never committed pointing to a snapshot object that does not exist.
        if isinstance(record.state, dict) and "snapshot" in record.state:
            address = record.state["snapshot"]
            try:
                await app.store._snapshots.get_info(address)  # type: ignore[union-attr]
            except NotFoundError:
                pytest.fail(f"record committed before its snapshot {address} was written")
            committed.append(address)
        await commit(self, record)

    monkeypatch.setattr(ChangeSetHandle, "commit", checked_commit)
    settings = fast_settings(subject_prefix, snapshot_inline_bytes=0)
    async with running_daemon(nc, settings, app) as daemon:
        written = count_object_puts(app, fail_first=1)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        reply = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/x", value=1)])
        assert reply.ok
        state = await settled(client, wk, cs, 1)
        assert state.values == {"/x": 1}
        assert reply.status.kind == "success" and reply.status.snapshot_address in written
        assert daemon.stats.requests_applied == 1
        assert daemon.stats.tasks_retried >= 1  # the failed write failed the group; the task was tried again
        # Nothing committed pointed anywhere but to the empty snapshot or to an object that was written.
        assert set(committed) <= {EMPTY.address, *written}


async def test_small_snapshots_live_in_the_record_through_forks_and_restarts(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    wk, head, feature = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
    app = SnapshotApp()
    async with running_daemon(nc, settings, app):
        written = count_object_puts(app)
        setup = [
            SetLiteral(path="/host", value="web"),
            SetFunction(path="/url", function="format", args=["/fmt", "/host"]),
            SetLiteral(path="/fmt", value="http://{}"),
        ]
        assert (await client.enqueue_updates_with_reply(wk, head, setup)).ok
        assert (await settled(client, wk, head, 3)).values["/url"] == "http://web"  # a DVU commit too
        await client.fork_change_set(wk, feature, head)
        assert (
            await client.enqueue_updates_with_reply(wk, feature, [SetLiteral(path="/host", value="db")])
        ).ok
        await settled(client, wk, feature, 3)
        # Moving head on after the fork: the fork point now lives only in the feature's record.
        assert (await client.enqueue_updates_with_reply(wk, head, [SetLiteral(path="/other", value=1)])).ok
        assert written == []
    # Another daemon, nothing cached: every snapshot (current ones and the fork point) comes from the records.
    async with running_daemon(nc, settings, SnapshotApp()):
        assert (await client.get_change_set(wk, feature)).values["/url"] == "http://db"
        assert (await client.enqueue_updates_from_change_set_with_reply(wk, head, feature)).ok
        values = (await settled(client, wk, head, 4)).values
        assert values == {"/host": "db", "/fmt": "http://{}", "/url": "http://db", "/other": 1}


async def test_a_committed_small_snapshot_is_not_decoded_again_from_its_record(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rebaser_server.apps.snapshots.model import Snapshot

    decoded: list[int] = []
    original = Snapshot.decode.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Snapshot], data: bytes) -> Snapshot:
        decoded.append(len(data))
        result: Snapshot = original(cls, data)
        return result

    settings = fast_settings(subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    app = SnapshotApp()
    async with running_daemon(nc, settings, app):
        first = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=0)])
        assert first.ok
        monkeypatch.setattr(Snapshot, "decode", classmethod(counting))
        for i in range(1, 6):  # each request a group of its own, each starting from the last one's commit
            assert (await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=i)])).ok
        assert decoded == []
        assert (await client.get_change_set(wk, cs)).values == {"/n": 5}
