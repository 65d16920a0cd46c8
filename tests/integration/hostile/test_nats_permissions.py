"""The reference account configuration (docs/nats-accounts.conf) on a real nats-server: a caller in an account of its
own gets its work done, and reaches nothing of the daemons' account but what it imports (its requests, tasks,
queries, batches, the layout read, its events consumer made by a daemon, its own inbox); a follower of one workspace
reads that workspace's events, and no other workspace's.

In an account of its own, a publish outside its imports is no permission violation: it stays in the caller's
account, where nothing stores or answers it. So each test checks the effect (no answer, nothing stored, nothing
received), not an error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

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
from rebaser_server.record.reader import StoreReader
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.accounts import CONFINED, accounts_server, connect_as, daemon_nc
from tests.support.apps import RecordingApp
from tests.support.events import next_durable

__all__ = ["accounts_server", "daemon_nc"]  # fixtures

FOLLOWED = CONFINED


async def _unanswered(conn: NatsClient, subject: str, body: bytes = b"") -> bool:
    """Whether a request on ``subject`` reaches nothing of the daemons' account: nobody answers it (nothing the
    caller's account imports), or only nats-server does, saying the caller's own account has no JetStream. A
    JetStream API request is sent with a well-formed body, so that the answer is about the account, not the body."""
    if subject.startswith("$JS.API.") and not body.startswith(b"{"):
        config = {"name": "x", "deliver_subject": "_INBOX.x", "ack_policy": "none"}
        body = json.dumps({"stream_name": subject.split(".")[4], "config": config}).encode()
    try:
        answer = await conn.request(subject, body, timeout=2)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        return True
    try:
        error = json.loads(answer.data)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return bool(error.get("err_code") == 10039)  # "JetStream not enabled for account"


async def test_caller_works_and_reaches_nothing_it_does_not_import(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    errors: list[str] = []
    caller = await connect_as(accounts_server, "client-1", errors)
    other = await connect_as(accounts_server, "workspace-1", errors)
    settings = fast_settings(None)
    try:
        async with (
            running_daemon(daemon_nc, settings, RecordingApp()) as daemon,
            RebaserClient(caller) as client,
            RebaserClient(other) as other_client,
        ):
            wk, cs = WorkspacePk.new(), ChangeSetId.new()
            assert (
                await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
            ).ok
            with pytest.raises(RebaserRefused, match="cannot describe"):  # a query is answered
                await client.get_change_set(wk, cs)
            # It stores update batches, for any workspace.
            updates: list[Update] = [SetLiteral(path=f"/b{i}", value="x" * 100) for i in range(3000)]
            stored = await client.store_batch(wk, updates)
            reader = StoreReader(daemon_nc.jetstream(), settings, daemon.store)
            assert await reader.stored_updates(wk, stored.address) == updates
            key = settings.subjects.change_set_key(wk, cs)
            before = await daemon.store.kv.get(key)

            # Another caller's replies never reach it, even subscribed to every inbox of its account.
            seen: list[Msg] = []

            async def spy(msg: Msg) -> None:
                seen.append(msg)

            await caller.subscribe("_INBOX.>", cb=spy)
            await caller.subscribe(">", cb=spy)
            await caller.flush()
            own = ChangeSetId.new()
            reply = await other_client.enqueue_updates_with_reply(
                FOLLOWED, own, [SetLiteral(path="/n", value=1)], timeout=20
            )
            assert reply.ok
            # Records, snapshots, the streams' API, another bucket's direct get, dead letters: nobody answers.
            forbidden = [
                f"$KV.{settings.subjects.change_sets_bucket}.{key}",
                f"$O.{settings.subjects.snapshots_bucket}.M.abc",
                f"$JS.API.STREAM.DELETE.{settings.subjects.requests_stream}",
                f"$JS.API.STREAM.INFO.{settings.subjects.requests_stream}",
                f"$JS.API.DIRECT.GET.KV_{settings.subjects.change_sets_bucket}",
                f"$JS.API.DIRECT.GET.KV_{settings.subjects.change_sets_bucket}.$KV.{settings.subjects.change_sets_bucket}.{key}",
                f"$JS.API.CONSUMER.CREATE.{settings.subjects.requests_stream}",
                f"dlq.rebaser.requests.{wk}.{cs}",
            ]
            for subject in forbidden:
                assert await _unanswered(caller, subject, b"forged"), subject
            after = await daemon.store.kv.get(key)
            assert after.revision == before.revision and after.value == before.value
            assert (await daemon_nc.jetstream().stream_info(settings.subjects.requests_stream)).config.name
            assert (
                await daemon_nc.jetstream().stream_info(settings.subjects.dead_letter_stream)
            ).state.messages == 0
            # All it saw were its own messages: the forged publishes and requests above, on its own subjects.
            assert not [m for m in seen if m.subject.startswith("_INBOX.workspace-1")], [
                m.subject for m in seen
            ]
            assert not [m for m in seen if str(FOLLOWED) in m.subject or str(own) in m.subject]
            # And the caller still works after all that; nothing it did was an error.
            assert (
                await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=2)], timeout=20)
            ).ok
            assert not [e for e in errors if "violation" in e], errors
    finally:
        await caller.close()
        await other.close()


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
    from rebaser_core.nats.connect import ConnectOptions

    url = f"nats://client-1:wrong-password@127.0.0.1:{accounts_server.port}"
    with pytest.raises(RebaserUnavailable) as raised:
        await RebaserClient.connect(
            ConnectOptions(servers=(url,), connect_timeout=1.0, extra={"max_reconnect_attempts": 0})
        )
    assert "wrong-password" not in str(raised.value) and "***@127.0.0.1" in str(raised.value)


async def test_follower_reads_its_workspace_events_and_no_other(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    errors: list[str] = []
    follower_nc = await connect_as(accounts_server, "follower-1", errors)
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
            running_daemon(daemon_nc, settings, RecordingApp()) as daemon,
            RebaserClient(daemon_nc) as writer,
        ):

            async def write(wk: WorkspacePk, change_set: ChangeSetId, value: int) -> None:
                updates = [SetLiteral(path="/n", value=value)]
                assert (await writer.enqueue_updates_with_reply(wk, change_set, updates, timeout=20)).ok

            for n in range(2):
                await write(FOLLOWED, cs, n)
                await write(other, other_cs, n)
            follower = RebaserClient(follower_nc)

            # Its workspace: one change set from the start, then the whole workspace.
            async with follower.watch(FOLLOWED, cs, since=0, feed="stream") as feed:
                events = await next_durable(feed, 2)
            assert [(e.workspace_id, e.change_set_id, e.kind, e.seq) for e in events] == [
                (FOLLOWED, cs, "applied", 1),
                (FOLLOWED, cs, "applied", 2),
            ]
            workspace_feed = follower.watch(FOLLOWED, since={cs: 0}, feed="stream")
            await workspace_feed.start()
            try:
                assert [e.seq for e in await next_durable(workspace_feed, 2)] == [1, 2]

                # Another workspace: watch() finds no daemon to make its consumer (its account imports only its own
                # workspace's follow API), a change set or the whole workspace.
                refused = await asyncio.gather(
                    follower.watch(other, other_cs, since=0, feed="stream").start(),
                    follower.watch(other, since={}, feed="stream").start(),
                    return_exceptions=True,
                )
                assert all(isinstance(r, RebaserUnavailable) for r in refused), refused

                # Nor by hand: a subscription to the events subjects sees only its own account...
                await follower_nc.subscribe(f"rebaser.events.{other}.>", cb=leak)
                await follower_nc.subscribe("rebaser.events.>", cb=leak)
                inbox = follower_nc.new_inbox()
                await follower_nc.subscribe(inbox, cb=leak)
                other_filter = subjects.events_of_workspace(other)

                def create(name: str, filter_: str, deliver: str = inbox) -> bytes:
                    config = {
                        "name": name,
                        "filter_subject": filter_,
                        "deliver_subject": deliver,
                        "deliver_policy": "all",
                        "ack_policy": "none",
                    }
                    return json.dumps({"stream_name": stream, "config": config}).encode()

                # ... the JetStream API (it has none), and the follow API of another workspace.
                unanswered = {
                    f"$JS.API.CONSUMER.CREATE.{stream}.spy1.{other_filter}": create("spy1", other_filter),
                    f"$JS.API.CONSUMER.CREATE.{stream}": create("spy2", other_filter),
                    f"$JS.API.CONSUMER.CREATE.{stream}.spy3.rebaser.events.*.*": create(
                        "spy3", "rebaser.events.*.*"
                    ),
                    f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.spy5": create("spy5", other_filter),
                    f"$JS.API.DIRECT.GET.{stream}.{subjects.events(other, other_cs)}": b"",
                    f"$JS.API.STREAM.MSG.GET.{stream}": json.dumps({"last_by_subj": other_filter}).encode(),
                    f"{subjects.follow_api(other)}.CONSUMER.CREATE.{stream}.spy4.{other_filter}": create(
                        "spy4", other_filter
                    ),
                }
                for subject, body in unanswered.items():
                    assert await _unanswered(follower_nc, subject, body), subject
                # Its own workspace's follow API with another workspace's filter, or the whole stream: the daemon
                # refuses it.
                own_api = f"{subjects.follow_api(FOLLOWED)}.CONSUMER.CREATE.{stream}"
                for subject, body in (
                    (f"{own_api}.spy6.{other_filter}", create("spy6", other_filter)),
                    (f"{own_api}.spy7.rebaser.events.*.*", create("spy7", "rebaser.events.*.*")),
                    (
                        f"{own_api}.spy8.{subjects.events_of_workspace(FOLLOWED)}",
                        create("spy8", other_filter),
                    ),
                ):
                    answer = json.loads((await follower_nc.request(subject, body, timeout=5)).data)
                    assert answer["error"]["code"] == 400, answer

                # It cannot forge events either, of its workspace or another's: those subjects are its own.
                js = daemon_nc.jetstream()
                forged = [subjects.events(FOLLOWED, cs), subjects.events(other, other_cs)]
                for subject in forged:
                    await follower_nc.publish(subject, b"forged")
                await follower_nc.flush()
                for subject in forged:
                    assert (await js.get_last_msg(stream, subject)).data != b"forged"
                leaked.clear()  # the forged publishes came back to its own subscriptions: its own account

                # The daemon goes on publishing both workspaces' events: the follower gets its own, and nothing else
                # (the other workspace's last, written after its own, would have arrived by then).
                await write(other, other_cs, 2)
                await write(FOLLOWED, cs, 2)
                await write(other, other_cs, 3)
                [third] = await next_durable(workspace_feed, 1)
                assert (third.workspace_id, third.change_set_id, third.seq) == (FOLLOWED, cs, 3)
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
            assert daemon.queries.followers.refused == 3
            assert not [e for e in errors if "violation" in e], errors
    finally:
        await follower_nc.close()


async def test_follower_recreates_its_consumer_within_its_account(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    """The ordered consumer is created again (by a daemon, under a new name) when its consumer is lost, and the feed
    goes on from where it was."""
    errors: list[str] = []
    follower_nc = await connect_as(accounts_server, "follower-1", errors)
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
            async with RebaserClient(follower_nc).watch(FOLLOWED, cs, since=0, feed="stream") as feed:
                assert [e.seq for e in await next_durable(feed, 1)] == [1]
                [lost] = await js.consumers_info(stream)
                await js.delete_consumer(stream, lost.name)
                assert (await writer.enqueue_updates_with_reply(FOLLOWED, cs, write, timeout=20)).ok
                # nats-py notices two missing heartbeats (the client asks for one every 2 s), makes the consumer again.
                assert [e.seq for e in await next_durable(feed, 1, timeout=40)] == [2]
                [again] = await js.consumers_info(stream)
                assert again.name != lost.name
                assert again.config.filter_subject == settings.subjects.events(FOLLOWED, cs)
        assert not [e for e in errors if "violation" in e], errors
    finally:
        await follower_nc.close()


async def test_follower_answers_flow_control_within_its_account(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    """A long replay goes through JetStream's flow control, which the follower's account must import: without
    ``$JS.FC.REBASER_EVENTS.>`` its consumer stops for good after some 2 MB."""
    errors: list[str] = []
    follower_nc = await connect_as(accounts_server, "follower-1", errors)
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
            async with RebaserClient(follower_nc).watch(FOLLOWED, since={}, feed="stream") as feed:
                [event] = await next_durable(feed, 1, timeout=30)
                assert (event.change_set_id, event.seq) == (cs, 1)
                assert feed.malformed == filler
        assert not [e for e in errors if "violation" in e], errors
    finally:
        await follower_nc.close()


async def test_a_workspace_caller_works_in_its_workspace_and_reaches_no_other(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    # workspace-1 of the configuration is confined to FOLLOWED. Widening any of its imports (a * for the workspace,
    # another inbox) lets one of the operations below through, and the checks fail.
    errors: list[str] = []
    caller = await connect_as(accounts_server, "workspace-1", errors)
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
            # Every way into another workspace: nobody answers, nothing is stored.
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
                f"{settings.subjects.follow_api(other)}.CONSUMER.CREATE.REBASER_EVENTS.x.rebaser.events.{other}.*",
                f"$JS.API.CONSUMER.CREATE.REBASER_EVENTS.x.rebaser.events.{other}.{cs}",
                # Batches: another workspace's, written or read; none of the first layout's object store at all.
                settings.subjects.batch_part(other, stored.address, 0),
                settings.subjects.batch_part(other, stored.address, MANIFEST),
                f"$JS.API.DIRECT.GET.{batches}.{settings.subjects.batch_part(other, stored.address, MANIFEST)}",
                f"$JS.API.DIRECT.GET.{batches}.{settings.subjects.batch_part(FOLLOWED, stored.address, MANIFEST)}",
                f"$JS.API.DIRECT.GET.{batches}",
                f"$JS.API.STREAM.MSG.GET.{batches}",
                f"$O.{settings.subjects.batches_bucket}.C.x",
            ]
            for subject in forbidden:
                assert await _unanswered(caller, subject, b"forged"), subject
            # Another caller's replies: its account imports only its own inbox prefix.
            got: list[Msg] = []

            async def spy(msg: Msg) -> None:
                got.append(msg)

            await caller.subscribe("_INBOX.client-1.>", cb=spy)
            started = time.monotonic()
            await daemon_nc.publish("_INBOX.client-1.x", b"for client-1")
            await daemon_nc.publish("_INBOX.workspace-1.probe", b"for workspace-1")
            probe = await caller.subscribe("_INBOX.workspace-1.probe")
            await caller.flush()
            heard: list[Msg] = []
            while not heard:  # again until the probe hears one: a busy machine may lose neither, but be slow
                await daemon_nc.publish("_INBOX.client-1.x", b"for client-1")
                await daemon_nc.publish("_INBOX.workspace-1.probe", b"for workspace-1")
                with contextlib.suppress(nats.errors.TimeoutError):
                    heard.append(await probe.next_msg(timeout=2))
                assert time.monotonic() < started + 60, f"the probe heard nothing; errors: {errors}"
            assert heard[0].data == b"for workspace-1"
            assert got == []  # published before the probe's message, on the same route: it would have come
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
            assert not [e for e in errors if "violation" in e], errors
    finally:
        await caller.close()
