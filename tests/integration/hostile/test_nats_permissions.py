"""The example account configuration (docs/nats-accounts.conf) on a real nats-server: a caller with those
permissions gets its work done, and cannot reach the daemons' records, snapshots, streams or other inboxes; a
follower of one workspace reads that workspace's events, and no other workspace's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.api import Update
from rebaser_core.batches import MANIFEST
from rebaser_core.embedded import NatsServer
from rebaser_core.errors import RebaserRefused, RebaserUnavailable, UnprocessableError
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.layout import shard_of
from rebaser_core.testing import wait_for
from rebaser_server.record.reader import StoreReader
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.events import next_durable

CONF = Path(__file__).parents[3] / "docs" / "nats-accounts.conf"
# The workspace whose events the user follower-1 of that configuration may read.
FOLLOWED = WorkspacePk("01HZZZZZZZZZZZZZZZZZZZZZZW")


@pytest.fixture
def accounts_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(store_dir=tmp_path / "nats", extra_args=["-c", str(CONF)])
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def daemon_nc(accounts_server: NatsServer) -> AsyncIterator[NatsClient]:
    conn = await nats.connect(accounts_server.url, user="rebaser-daemon", password="change-me-daemon")
    yield conn
    await conn.close()


async def _caller(server: NatsServer, user: str, errors: list[str]) -> NatsClient:
    """A connection as ``user`` of the example configuration (password ``change-me-<user>``, inbox prefix
    ``_INBOX.<user>``), each asynchronous error it gets (a permissions violation) appended to ``errors``."""

    async def on_error(err: Exception) -> None:
        errors.append(str(err))

    return await nats.connect(
        server.url,
        user=user,
        password=f"change-me-{user}",
        inbox_prefix=f"_INBOX.{user}",
        error_cb=on_error,
    )


async def test_caller_permissions(accounts_server: NatsServer, daemon_nc: NatsClient) -> None:
    errors: list[str] = []
    caller = await _caller(accounts_server, "client-1", errors)
    settings = fast_settings(None)
    try:
        async with (
            running_daemon(daemon_nc, settings, RecordingApp()) as daemon,
            RebaserClient(caller) as client,
        ):
            wk, cs = WorkspacePk.new(), ChangeSetId.new()
            assert (
                await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
            ).ok
            # Reading the shard layout is allowed (one direct get), and nothing else the client did was refused.
            assert not [e for e in errors if "permissions violation" in e.lower()]
            with pytest.raises(RebaserRefused, match="cannot describe"):  # a query is answered
                await client.get_change_set(wk, cs)
            # It stores update batches, for any workspace.
            updates: list[Update] = [SetLiteral(path=f"/b{i}", value="x" * 100) for i in range(3000)]
            stored = await client.store_batch(wk, updates)
            reader = StoreReader(daemon_nc.jetstream(), settings, daemon.store)
            assert await reader.stored_updates(wk, stored.address) == updates
            assert not [e for e in errors if "permissions violation" in e.lower()]
            key = settings.subjects.change_set_key(wk, cs)
            before = await daemon.store.kv.get(key)
            forbidden = [
                f"$KV.{settings.subjects.change_sets_bucket}.{key}",
                f"$O.{settings.subjects.snapshots_bucket}.M.abc",
                f"$JS.API.STREAM.DELETE.{settings.subjects.requests_stream}",
                # The layout's direct get is allowed; another bucket's is not.
                f"$JS.API.DIRECT.GET.KV_{settings.subjects.change_sets_bucket}",
                f"dlq.rebaser.requests.{wk}.{cs}",
                "_INBOX.someone-else.x",
            ]
            for subject in forbidden:
                await caller.publish(subject, b"forged")
            await caller.subscribe("_INBOX.>")  # other callers' replies, the daemons' deliveries
            await caller.flush()
            await wait_for(
                lambda: sum("permissions violation" in e.lower() for e in errors) >= len(forbidden) + 1,
                message=f"every forbidden publish and the subscription refused: {errors}",
            )
            after = await daemon.store.kv.get(key)
            assert after.revision == before.revision and after.value == before.value
            assert (await daemon_nc.jetstream().stream_info(settings.subjects.requests_stream)).config.name
            # And the caller still works after all that.
            assert (
                await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=2)], timeout=20)
            ).ok
    finally:
        await caller.close()


async def test_status_shows_no_credentials(accounts_server: NatsServer) -> None:
    url = f"nats://rebaser-daemon:change-me-daemon@127.0.0.1:{accounts_server.port}"
    conn = await nats.connect(url)
    try:
        async with running_daemon(conn, fast_settings(None), RecordingApp()) as daemon:
            status = json.dumps(await daemon.status())
            assert "change-me-daemon" not in status and "rebaser-daemon" not in status
            assert f"***@127.0.0.1:{accounts_server.port}" in status
    finally:
        await conn.close()


async def test_connect_failure_shows_no_credentials(accounts_server: NatsServer) -> None:
    from rebaser_core.errors import RebaserUnavailable
    from rebaser_core.nats.connect import ConnectOptions

    url = f"nats://client-1:wrong-password@127.0.0.1:{accounts_server.port}"
    with pytest.raises(RebaserUnavailable) as raised:
        await RebaserClient.connect(
            ConnectOptions(servers=(url,), connect_timeout=1.0, extra={"max_reconnect_attempts": 0})
        )
    assert "wrong-password" not in str(raised.value) and "***@127.0.0.1" in str(raised.value)


async def _connect_follower(server: NatsServer, errors: list[str]) -> NatsClient:
    async def on_error(err: Exception) -> None:
        errors.append(str(err).lower())  # nats-py lowercases the server's -ERR anyway

    return await nats.connect(
        server.url,
        user="follower-1",
        password="change-me-follower-1",
        inbox_prefix="_INBOX.follower-1",
        error_cb=on_error,
    )


async def test_follower_reads_its_workspace_events_and_no_other(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    errors: list[str] = []
    follower_nc = await _connect_follower(accounts_server, errors)
    settings = fast_settings(None, events=True)
    subjects = settings.subjects
    stream = subjects.events_stream
    other, cs, other_cs = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
    # Every message the follower gets other than through its own watches: there must be none.
    leaked: list[Msg] = []

    async def leak(msg: Msg) -> None:
        leaked.append(msg)

    try:
        async with (
            running_daemon(daemon_nc, settings, RecordingApp()),
            RebaserClient(daemon_nc) as writer,
        ):

            async def write(wk: WorkspacePk, change_set: ChangeSetId, value: int) -> None:
                updates = [SetLiteral(path="/n", value=value)]
                assert (await writer.enqueue_updates_with_reply(wk, change_set, updates, timeout=20)).ok

            for n in range(2):
                await write(FOLLOWED, cs, n)
                await write(other, other_cs, n)
            # watch() needs no start(): this user may not read the shard layout, and a follower does not need it.
            follower = RebaserClient(follower_nc)

            # Its workspace: one change set from the start, then the whole workspace.
            async with follower.watch(FOLLOWED, cs, since=0) as feed:
                events = await next_durable(feed, 2)
            assert [(e.workspace_id, e.change_set_id, e.kind, e.seq) for e in events] == [
                (FOLLOWED, cs, "applied", 1),
                (FOLLOWED, cs, "applied", 2),
            ]
            workspace_feed = follower.watch(FOLLOWED, since={cs: 0})
            await workspace_feed.start()
            try:
                assert [e.seq for e in await next_durable(workspace_feed, 2)] == [1, 2]

                # Another workspace: watch() is refused, a change set or the whole workspace (the consumer is not
                # created: the API request is a permission violation, so it is never answered).
                refused = await asyncio.gather(
                    follower.watch(other, other_cs, since=0).start(),
                    follower.watch(other, since={}).start(),
                    return_exceptions=True,
                )
                assert all(isinstance(r, RebaserUnavailable) for r in refused), refused

                # Nor by hand: a plain subscription to its events (or everyone's)...
                await follower_nc.subscribe(f"rebaser.events.{other}.>", cb=leak)
                await follower_nc.subscribe("rebaser.events.>", cb=leak)
                # ... a consumer on its filter, whichever form of the create request; the deliveries would come to
                # this inbox, which the follower may read.
                inbox = follower_nc.new_inbox()
                await follower_nc.subscribe(inbox, cb=leak)
                other_filter = subjects.events_of_workspace(other)

                def create(name: str, filter_: str) -> bytes:
                    config = {
                        "name": name,
                        "filter_subject": filter_,
                        "deliver_subject": inbox,
                        "deliver_policy": "all",
                        "ack_policy": "none",
                    }
                    return json.dumps({"stream_name": stream, "config": config}).encode()

                unanswered = {
                    f"$JS.API.CONSUMER.CREATE.{stream}.spy1.{other_filter}": create("spy1", other_filter),
                    f"$JS.API.CONSUMER.CREATE.{stream}": create("spy2", other_filter),
                    f"$JS.API.CONSUMER.CREATE.{stream}.spy3.rebaser.events.*.*": create(
                        "spy3", "rebaser.events.*.*"
                    ),
                    f"$JS.API.CONSUMER.CREATE.{stream}.spy4.rebaser.events.>": create(
                        "spy4", "rebaser.events.>"
                    ),
                    f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.spy5": create("spy5", other_filter),
                    # ... or reading the stored events one by one (the stream allows direct gets).
                    f"$JS.API.DIRECT.GET.{stream}.{subjects.events(other, other_cs)}": b"",
                    f"$JS.API.STREAM.MSG.GET.{stream}": json.dumps({"last_by_subj": other_filter}).encode(),
                }
                answers = await asyncio.gather(
                    *(follower_nc.request(subject, body, timeout=2) for subject, body in unanswered.items()),
                    return_exceptions=True,
                )
                assert all(isinstance(a, nats.errors.TimeoutError) for a in answers), answers
                # Its own workspace's filter in the subject and another's in the request: nats-server says no.
                mismatched = await follower_nc.request(
                    f"$JS.API.CONSUMER.CREATE.{stream}.spy6.{subjects.events_of_workspace(FOLLOWED)}",
                    create("spy6", other_filter),
                    timeout=5,
                )
                assert json.loads(mismatched.data)["error"]["err_code"] == 10131  # filter does not match

                # It cannot forge events either, of its workspace or another's.
                forged = [subjects.events(FOLLOWED, cs), subjects.events(other, other_cs)]
                for subject in forged:
                    await follower_nc.publish(subject, b"forged")
                await follower_nc.flush()

                def violations(subject: str) -> int:
                    return sum(
                        f'permissions violation for publish to "{subject.lower()}"' in e for e in errors
                    )

                def refused_all() -> bool:
                    # The create requests of the two watches on the other workspace, and spy1's.
                    creates = f'for publish to "$js.api.consumer.create.{stream.lower()}.'
                    return (
                        all(violations(subject) >= 1 for subject in [*unanswered, *forged])
                        and sum(creates in e and f".rebaser.events.{other}.".lower() in e for e in errors)
                        >= 3
                        and sum("permissions violation for subscription" in e for e in errors) == 2
                    )

                await wait_for(refused_all, message=f"every forbidden request refused: {errors}")
                js = daemon_nc.jetstream()
                for subject in forged:
                    assert (await js.get_last_msg(stream, subject)).data != b"forged"

                # The daemon goes on publishing both workspaces' events: the follower gets its own, and nothing else
                # (the other workspace's last, written after its own, would have arrived by then).
                await write(other, other_cs, 2)
                await write(FOLLOWED, cs, 2)
                await write(other, other_cs, 3)
                [third] = await next_durable(workspace_feed, 1)
                assert (third.workspace_id, third.change_set_id, third.seq) == (FOLLOWED, cs, 3)
                # One more of its own after the other's last: once it arrives, anything leaked before it has too
                # (the server delivers to one connection in order).
                await write(FOLLOWED, cs, 4)
                [fourth] = await next_durable(workspace_feed, 1)
                assert fourth.seq == 4
                await follower_nc.flush()
                assert workspace_feed.malformed == 0
            finally:
                await workspace_feed.close()
            assert leaked == []
            # No consumer of the events stream reads anything but the followed workspace's subjects.
            filters = {c.config.filter_subject for c in await js.consumers_info(stream)}
            assert filters and all(str(f).startswith(f"rebaser.events.{FOLLOWED}.") for f in filters), filters
            # Its own watches were never refused.
            assert not [e for e in errors if "consumer.create" in e and str(FOLLOWED).lower() in e], errors
    finally:
        await follower_nc.close()


async def test_follower_recreates_its_consumer_within_its_permissions(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    """The ordered consumer is created again (under a new name, on the same filtered API subject) when its consumer
    is lost, and the feed goes on from where it was."""
    errors: list[str] = []
    follower_nc = await _connect_follower(accounts_server, errors)
    settings = fast_settings(None, events=True)
    stream = settings.subjects.events_stream
    cs = ChangeSetId.new()
    js = daemon_nc.jetstream()
    try:
        async with (
            running_daemon(daemon_nc, settings, RecordingApp()),
            RebaserClient(daemon_nc) as writer,
        ):
            write = [SetLiteral(path="/n", value=1)]
            assert (await writer.enqueue_updates_with_reply(FOLLOWED, cs, write, timeout=20)).ok
            async with RebaserClient(follower_nc).watch(FOLLOWED, cs, since=0) as feed:
                assert [e.seq for e in await next_durable(feed, 1)] == [1]
                [lost] = await js.consumers_info(stream)
                await js.delete_consumer(stream, lost.name)
                assert (await writer.enqueue_updates_with_reply(FOLLOWED, cs, write, timeout=20)).ok
                # nats-py notices the missing heartbeats (two of 5 s) and creates the consumer again.
                assert [e.seq for e in await next_durable(feed, 1, timeout=40)] == [2]
                [again] = await js.consumers_info(stream)
                assert again.name != lost.name
                assert again.config.filter_subject == settings.subjects.events(FOLLOWED, cs)
        assert not [e for e in errors if "permissions violation" in e], errors
    finally:
        await follower_nc.close()


async def test_follower_answers_flow_control_within_its_permissions(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    """A long replay goes through JetStream's flow control, which the follower must be allowed to answer: without
    ``$JS.FC.REBASER_EVENTS.>`` its consumer stops for good after some 2 MB."""
    errors: list[str] = []
    follower_nc = await _connect_follower(accounts_server, errors)
    settings = fast_settings(None, events=True)
    subjects = settings.subjects
    cs = ChangeSetId.new()
    js = daemon_nc.jetstream()
    try:
        async with (
            running_daemon(daemon_nc, settings, RecordingApp()),
            RebaserClient(daemon_nc) as writer,
        ):
            # Some 4 MB to read before the event: not events (the feed skips them, and counts them).
            filler, change_sets = 600, [ChangeSetId.new() for _ in range(20)]
            for n in range(filler):
                await js.publish(subjects.events(FOLLOWED, change_sets[n % 20]), b"x" * 7000)
            updates = [SetLiteral(path="/n", value=1)]
            assert (await writer.enqueue_updates_with_reply(FOLLOWED, cs, updates, timeout=20)).ok
            async with RebaserClient(follower_nc).watch(FOLLOWED, since={}) as feed:
                [event] = await next_durable(feed, 1, timeout=30)
                assert (event.change_set_id, event.seq) == (cs, 1)
                assert feed.malformed == filler
        assert not [e for e in errors if "permissions violation" in e], errors
    finally:
        await follower_nc.close()


async def test_a_workspace_caller_works_in_its_workspace_and_nats_server_refuses_every_other(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    # workspace-1 of the example configuration is confined to FOLLOWED. Widening any of its permissions (a * for the
    # workspace, another inbox) lets one of the forbidden operations below through, and the count fails.
    errors: list[str] = []
    caller = await _caller(accounts_server, "workspace-1", errors)
    settings = fast_settings(None, streams=2)
    other, cs = WorkspacePk.new(), ChangeSetId.new()
    try:
        async with (
            running_daemon(daemon_nc, settings, RecordingApp()) as daemon,
            RebaserClient(caller) as client,
        ):
            # Its own workspace: requests (in both shards), replies, queries.
            owns = [
                next(c for c in iter(ChangeSetId.new, None) if shard_of(FOLLOWED, c, 2) == k) for k in (0, 1)
            ]
            for own in owns * 2:
                reply = await client.enqueue_updates_with_reply(
                    FOLLOWED, own, [SetLiteral(path="/n", value=1)], timeout=20
                )
                assert reply.ok, reply
            assert (await client.wait_settled(FOLLOWED, own, timeout=10)).settled
            with pytest.raises(RebaserRefused, match="cannot describe"):  # the query is answered
                await client.get_change_set(FOLLOWED, own)
            # Its workspace's backlog (which its client also asks before it enqueues).
            assert (await client.workspace_backlog(FOLLOWED)).limit > 0
            # Its update batches (more than one part), which the daemon finds in its workspace only.
            updates: list[Update] = [SetLiteral(path=f"/b{i}", value="x" * 100) for i in range(3000)]
            stored = await client.store_batch(FOLLOWED, updates)
            reader = StoreReader(daemon_nc.jetstream(), settings, daemon.store)
            assert await reader.stored_updates(FOLLOWED, stored.address) == updates
            with pytest.raises(UnprocessableError, match="does not exist"):
                await reader.stored_updates(other, stored.address)
            assert not [e for e in errors if "permissions violation" in e.lower()]
            # Every way into another workspace.
            other_shard = settings.subjects.for_shard(1)
            batches = settings.subjects.stored_batches_stream
            forbidden = [
                settings.subjects.requests(other, cs),
                other_shard.requests(other, cs),
                settings.subjects.task(other, cs),
                other_shard.task(other, cs),
                *(
                    settings.subjects.api(op, other, cs)
                    for op in ("get", "fork", "reply", "settled", "backlog")
                ),
                f"$JS.API.CONSUMER.CREATE.REBASER_EVENTS.x.rebaser.events.{other}.*",
                f"$JS.API.CONSUMER.CREATE.REBASER_EVENTS.x.rebaser.events.{other}.{cs}",
                # Batches: another workspace's, written or read; none of the first layout's object store at all.
                settings.subjects.batch_part(other, stored.address, 0),
                settings.subjects.batch_part(other, stored.address, MANIFEST),
                f"$JS.API.DIRECT.GET.{batches}.{settings.subjects.batch_part(other, stored.address, MANIFEST)}",
                f"$JS.API.DIRECT.GET.{batches}.{settings.subjects.batch_part(FOLLOWED, stored.address, MANIFEST)}",
                f"$JS.API.DIRECT.GET.{batches}",
                f"$JS.API.STREAM.MSG.GET.{batches}",
                f"$O.{settings.subjects.batches_bucket}.C.x",
                "_INBOX.client-1.x",
            ]
            for subject in forbidden:
                await caller.publish(subject, b"forged", reply="_INBOX.workspace-1.x")
            await caller.subscribe("_INBOX.client-1.>")  # another caller's replies
            await caller.flush()
            await wait_for(
                lambda: sum("permissions violation" in e.lower() for e in errors) >= len(forbidden) + 1,
                message=f"every forbidden publish and the subscription refused: {errors}",
            )
            js = daemon_nc.jetstream()
            for names in (settings.subjects, other_shard):
                for stream, subject in (
                    (names.requests_stream, names.requests_all),
                    (names.tasks_stream, names.tasks_all),
                ):
                    kept = (await js.stream_info(stream, subjects_filter=subject)).state.subjects or {}
                    assert not [s for s in kept if str(other) in s], kept
            kept = (await js.stream_info(batches, subjects_filter=">")).state.subjects or {}
            assert kept and not [s for s in kept if str(other) in s], kept
            assert daemon.stats.requests_applied == 4
    finally:
        await caller.close()
