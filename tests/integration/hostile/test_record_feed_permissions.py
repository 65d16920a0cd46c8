"""The record feed under the reference account configuration (docs/nats-accounts.conf): a follower confined to one
workspace reads that workspace's events from the records' writes, their headers only (never a record's state or
replies), and no other workspace's, however it asks."""

from __future__ import annotations

import json

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_server.testing import fast_settings, running_daemon
from tests.integration.hostile.test_nats_permissions import _unanswered
from tests.support.accounts import CONFINED, accounts_server, connect_as, daemon_nc, request_answered
from tests.support.apps import RecordingApp
from tests.support.events import next_durable

__all__ = ["accounts_server", "daemon_nc"]  # fixtures

FOLLOWED = CONFINED


async def test_a_follower_reads_its_workspaces_record_events_headers_only_and_no_other(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    errors: list[str] = []
    follower_nc = await connect_as(accounts_server, "follower-1", errors)
    settings = fast_settings(None)  # the defaults: the record feed, no events stream
    names = settings.subjects
    stream = names.records_stream
    other, cs, other_cs = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
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
            async with follower.watch(FOLLOWED, cs, since=0) as feed:
                events = await next_durable(feed, 2)
            assert [(e.workspace_id, e.change_set_id, e.seq) for e in events] == [
                (FOLLOWED, cs, 1),
                (FOLLOWED, cs, 2),
            ]

            workspace_feed = await follower.watch(FOLLOWED, since={cs: 2}).start()
            try:
                inbox = follower_nc.new_inbox()
                await follower_nc.subscribe(inbox, cb=leak)
                await follower_nc.subscribe("$KV.>", cb=leak)

                def create(name: str, filter_: str, *, headers_only: bool = False) -> bytes:
                    config = {
                        "name": name,
                        "filter_subject": filter_,
                        "deliver_subject": inbox,
                        "deliver_policy": "all",
                        "ack_policy": "none",
                        "headers_only": headers_only,
                    }
                    return json.dumps({"stream_name": stream, "config": config}).encode()

                other_filter = names.records_of_workspace(other)
                # No JetStream API of its own, and no follow API of another workspace.
                for subject, body in {
                    f"$JS.API.CONSUMER.CREATE.{stream}.spy1.{other_filter}": create("spy1", other_filter),
                    f"$JS.API.DIRECT.GET.{stream}.{names.record_subject(other, other_cs)}": b"",
                    f"{names.follow_api(other)}.CONSUMER.CREATE.{stream}.spy2.{other_filter}": create(
                        "spy2", other_filter
                    ),
                }.items():
                    assert await _unanswered(follower_nc, subject, body), subject
                # Its own workspace's follow API with another workspace's filter, or the whole bucket: refused.
                own_api = f"{names.follow_api(FOLLOWED)}.CONSUMER.CREATE.{stream}"
                for subject, body in (
                    (f"{own_api}.spy3.{other_filter}", create("spy3", other_filter)),
                    (f"{own_api}.spy4.{names.records_all}", create("spy4", names.records_all)),
                    (f"{own_api}.spy5.$KV.{names.change_sets_bucket}.>", create("spy5", names.records_all)),
                    (f"{own_api}.spy6.{names.records_of_workspace(FOLLOWED)}", create("spy6", other_filter)),
                ):
                    answer = json.loads((await request_answered(follower_nc, subject, body)).data)
                    assert answer["error"]["code"] == 400, answer
                # Its own records, asked with their bodies: made, but headers only all the same.
                mine = names.records_of_workspace(FOLLOWED)
                made = json.loads(
                    (await request_answered(follower_nc, f"{own_api}.mine.{mine}", create("mine", mine))).data
                )
                assert "error" not in made and made["config"]["headers_only"] is True, made

                await write(other, other_cs, 2)
                await write(FOLLOWED, cs, 2)
                [third] = await next_durable(workspace_feed, 1)
                assert (third.workspace_id, third.change_set_id, third.seq) == (FOLLOWED, cs, 3)
                await follower_nc.flush()
                # What its own consumer "mine" delivered: its workspace's writes, each without the record.
                delivered = [m for m in leaked if m.subject.startswith("$KV.")]
                assert delivered, "the headers-only consumer delivered nothing"
                assert all(
                    m.subject.startswith(f"$KV.{names.change_sets_bucket}.{FOLLOWED}.") for m in delivered
                )
                assert all(m.data == b"" and m.headers and "Nats-Msg-Size" in m.headers for m in delivered)
                assert workspace_feed.malformed == 0
            finally:
                await workspace_feed.close()
            js = daemon_nc.jetstream()
            consumers = await js.consumers_info(stream)
            followers = [
                c for c in consumers if c.config.deliver_subject and "_INBOX" in c.config.deliver_subject
            ]
            assert all(
                c.config.headers_only
                and str(c.config.filter_subject).startswith(f"$KV.{names.change_sets_bucket}.{FOLLOWED}.")
                for c in followers
            ), [c.config for c in followers]
            assert daemon.queries.followers.refused == 4
            assert not [e for e in errors if "violation" in e], errors
    finally:
        await follower_nc.close()
