"""A reply subject is a write: nats-server checks a publish's subject against what a caller may do, never its reply
subject, and JetStream, nats-server or a daemon answers there on the caller's behalf. In one account with the daemons,
a caller allowed to publish a task could have JetStream's acknowledgement written over another workspace's change-set
record, an operator's pause, the shard layout, or into any stream.

With docs/nats-accounts.conf each caller is in an account of its own: every publish it may make crosses a service
import, whose reply subject nats-server rewrites to one that routes back to the caller's account. These tests make
every publish each caller user of the configuration may make, with its reply subject set to each subject of the
daemons' account worth writing, and check that nothing was stored there, that the answers came back to the
attacker's own account instead, and that the victims still work. The control test shows the check catches the write
when the publisher shares the daemons' account."""

from __future__ import annotations

import json
from collections import Counter

import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.batches import MANIFEST
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.accounts import CALLERS, CONFINED, accounts_server, connect_as, daemon_nc
from tests.support.apps import RecordingApp

__all__ = ["accounts_server", "daemon_nc"]  # fixtures

ADDRESS = "ab" * 32  # a batch address (64 hex digits)


def _targets(
    settings: Settings, victim: WorkspacePk, cs: ChangeSetId, paused: ChangeSetId, address: str
) -> dict[str, tuple[str, str]]:
    """name -> (stream, subject): the subjects of the daemons' account an attacker would write, each in its stream."""
    names = settings.subjects
    fresh = ChangeSetId.new()
    return {
        "change-set record": (
            f"KV_{names.change_sets_bucket}",
            f"$KV.{names.change_sets_bucket}.{victim}.{cs}",
        ),
        "pause": (f"KV_{names.pauses_bucket}", f"$KV.{names.pauses_bucket}.cs.{victim}.{paused}"),
        "shard layout": (f"KV_{names.layout_bucket}", f"$KV.{names.layout_bucket}.{names.layout_key}"),
        "requests": (names.requests_stream, names.requests(victim, fresh)),
        "tasks": (names.tasks_stream, names.task(victim, fresh)),
        # A new subject of a stream that keeps every message: an answer would be a message more there (the victim
        # change set's own subject gets its daemon's later notices).
        "events": (names.events_stream, names.events(victim, fresh)),
        "dead letters": (names.dead_letter_stream, names.dead_letter(victim, cs)),
        "batch manifest": (names.stored_batches_stream, names.batch_part(victim, address, MANIFEST)),
    }


def _allowed(settings: Settings, user: str, workspace: WorkspacePk) -> tuple[list[str], list[str]]:
    """(publishes answered by someone, publishes answered by nobody) that ``user`` of the configuration may make, in
    the workspace it may use."""
    names = settings.subjects
    cs = ChangeSetId.new()
    shard = names.for_shard(1)
    layout = f"$JS.API.DIRECT.GET.KV_{names.layout_bucket}.$KV.{names.layout_bucket}.{names.layout_key}"
    follow = (
        f"{names.follow_api(workspace)}.CONSUMER.CREATE.{names.events_stream}.x.{names.events(workspace, cs)}"
    )
    follow_records = (
        f"{names.follow_api(workspace)}.CONSUMER.CREATE.{names.records_stream}.x."
        f"{names.record_subject(workspace, cs)}"
    )
    flow_control = [f"$JS.FC.{names.events_stream}.x.1", f"$JS.FC.{names.records_stream}.x.1"]
    if user == "follower-1":
        return [layout, follow, follow_records], flow_control
    answered = [
        names.requests(workspace, cs),
        shard.requests(workspace, cs),
        names.task(workspace, cs),
        shard.task(workspace, cs),
        *(names.api(op, workspace, cs) for op in ("get", "fork", "reply", "settled", "backlog")),
        names.batch_part(workspace, ADDRESS, 0),
        names.batch_part(workspace, ADDRESS, MANIFEST),
        layout,
        follow,
        follow_records,
    ]
    return answered, flow_control


async def _last_seq(js: JetStreamContext, stream: str, subject: str) -> int | None:
    try:
        return (await js.get_last_msg(stream, subject)).seq
    except nats.js.errors.NotFoundError:
        return None


async def _victims(
    daemon_nc: NatsClient, settings: Settings
) -> tuple[WorkspacePk, ChangeSetId, ChangeSetId, str]:
    """A workspace with a change set that has a record, events and a stored batch, and one that is paused."""
    victim, cs, paused = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
    async with RebaserClient(daemon_nc) as owner:
        assert (
            await owner.enqueue_updates_with_reply(victim, cs, [SetLiteral(path="/n", value=1)], timeout=20)
        ).ok
        await owner.pause_change_set(victim, paused, "held by the operator")
        stored = await owner.store_batch(victim, [SetLiteral(path="/b", value=1)])
    return victim, cs, paused, stored.address


async def _attack(
    server: NatsServer, settings: Settings, user: str, targets: dict[str, tuple[str, str]]
) -> None:
    """Every publish ``user`` may make, with each target as its reply subject; returns once every answer came back to
    the attacker's own account, on the very subjects it named."""
    attacker = await connect_as(server, user)
    try:
        workspace = CONFINED if user != "client-1" else WorkspacePk.new()
        answered, unanswered = _allowed(settings, user, workspace)
        came_back: Counter[str] = Counter()

        async def count(msg: Msg) -> None:
            came_back[msg.subject] += 1

        for _, subject in targets.values():
            await attacker.subscribe(subject, cb=count)
        await attacker.flush()
        for publish in answered + unanswered:
            for _, subject in targets.values():
                await attacker.publish(publish, b"", reply=subject)
        await attacker.flush()
        await wait_for(
            lambda: all(came_back[s] >= len(answered) for _, s in targets.values()),
            timeout=30,
            message=f"{user}: every answer came back to its own account ({dict(came_back)})",
        )
    finally:
        await attacker.close()


async def test_no_answer_on_a_callers_behalf_lands_in_the_daemons_account(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    settings = fast_settings(None, events=True, streams=2)
    js = daemon_nc.jetstream()
    async with running_daemon(daemon_nc, settings, RecordingApp()):
        victim, cs, paused, address = await _victims(daemon_nc, settings)
        targets = _targets(settings, victim, cs, paused, address)
        # What the victims hold already (what an overwrite would destroy); the others are new subjects to fill.
        held = ("change-set record", "pause", "shard layout", "batch manifest")
        before = {name: await _last_seq(js, *where) for name, where in targets.items()}
        assert all(before[name] is not None for name in held), str(before)

        for user in CALLERS:
            await _attack(accounts_server, settings, user, targets)

        after = {name: await _last_seq(js, *where) for name, where in targets.items()}
        assert after == before, {n: (before[n], after[n]) for n in targets if before[n] != after[n]}
        # The victims work as before: the change set takes requests, the pause holds, the layout is read.
        async with RebaserClient(daemon_nc) as owner:
            assert (
                await owner.enqueue_updates_with_reply(
                    victim, cs, [SetLiteral(path="/n", value=2)], timeout=20
                )
            ).ok
            assert (await owner.pause_of(victim, paused)) is not None


async def test_the_check_sees_a_write_through_a_reply_subject_in_the_daemons_account(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    """The control: a user of the daemons' account (as every caller was before accounts) publishes one task with its
    reply subject on another workspace's change-set record, and JetStream's acknowledgement overwrites it."""
    settings = fast_settings(None, events=True)
    js = daemon_nc.jetstream()
    async with running_daemon(daemon_nc, settings, RecordingApp()):
        victim, cs, paused, address = await _victims(daemon_nc, settings)
        stream, record = _targets(settings, victim, cs, paused, address)["change-set record"]
        before = await _last_seq(js, stream, record)
        operator = await connect_as(accounts_server, "rebaser-operator", password="change-me-operator")
        try:
            await operator.publish(
                settings.subjects.task(WorkspacePk.new(), ChangeSetId.new()), b"", reply=record
            )
            await operator.flush()
            await wait_for(lambda: _last_seq(js, stream, record), message="the acknowledgement is stored")
            overwritten = await js.get_last_msg(stream, record)
            assert overwritten.seq != before
            assert json.loads(overwritten.data)["stream"] == settings.subjects.tasks_stream
        finally:
            await operator.close()


async def test_a_follower_cannot_choose_where_its_events_are_delivered(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    """The daemon that makes a follower's consumer checks its deliver subject: an inbox, never a subject of the
    deployment nor a ``$`` one, where a stream would store the events."""
    settings = fast_settings(None, events=True)
    names = settings.subjects
    js = daemon_nc.jetstream()
    async with running_daemon(daemon_nc, settings, RecordingApp()) as daemon:
        victim, cs, paused, address = await _victims(daemon_nc, settings)
        targets = _targets(settings, victim, cs, paused, address)
        before = {name: await _last_seq(js, *where) for name, where in targets.items()}
        async with RebaserClient(daemon_nc) as writer:  # events of the attacker's own workspace, to be pushed
            assert (
                await writer.enqueue_updates_with_reply(
                    CONFINED, cs, [SetLiteral(path="/n", value=1)], timeout=20
                )
            ).ok
        attacker = await connect_as(accounts_server, "workspace-1")
        try:
            filter_ = names.events_of_workspace(CONFINED)
            for n, (_, deliver) in enumerate(targets.values()):
                config = {
                    "name": f"spy{n}",
                    "filter_subject": filter_,
                    "deliver_subject": deliver,
                    "deliver_policy": "all",
                    "ack_policy": "none",
                }
                body = json.dumps({"stream_name": names.events_stream, "config": config}).encode()
                subject = (
                    f"{names.follow_api(CONFINED)}.CONSUMER.CREATE.{names.events_stream}.spy{n}.{filter_}"
                )
                answer = json.loads((await attacker.request(subject, body, timeout=5)).data)
                assert answer["error"]["code"] == 400 and "deliver subject" in answer["error"]["description"]
        finally:
            await attacker.close()
        assert daemon.queries.followers.refused == len(targets)
        assert await js.consumers_info(names.events_stream) == []
        after = {name: await _last_seq(js, *where) for name, where in targets.items()}
        assert after == before
