"""Pausing, resuming and skipping (rebaser_client._pausing and ``rebaser change-set pause|resume|skip``,
``rebaser workspace pause|resume``) against a real nats-server: what is written to the pauses bucket, which tasks are
given on resume, what a skip moves to the dead letters, and what ``status`` and ``change-set show`` say.

No daemon runs in most of these tests (the daemons' side is tested with the daemon): requests are stored straight
into the streams, without a task, as if a daemon had let their change set go; a daemon holding a change set is
played by fetching its task from the tasks consumer without acking it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from click.testing import CliRunner, Result
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import StorageType
from nats.js.errors import KeyNotFoundError, NotFoundError

from rebaser_client import (
    HeldByDaemon,
    NotFirstInLine,
    NotPaused,
    RebaserClient,
    RebaserRefused,
    RebaserTimeout,
    SetLiteral,
    StillHeld,
    SyncRebaserClient,
)
from rebaser_client._pausing import (
    list_pauses,
    pause_change_set,
    pause_of,
    pause_workspace,
    resume_change_set,
    resume_workspace,
)
from rebaser_client._skipping import SKIP_REASON, skip_request
from rebaser_client.admin.change_set import change_set_report
from rebaser_client.admin.cli.main import main as cli
from rebaser_client.admin.dead_letters import dead_letters
from rebaser_client.admin.repairs import check_replayable
from rebaser_client.admin.status import status_report
from rebaser_core import headers as h
from rebaser_core.api import ENQUEUE_UPDATES_REQUEST, EnqueueUpdatesRequest, InlineUpdates
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.layout_store import init_layout
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.pauses import Pause, change_set_key, workspace_key
from rebaser_core.subjects import Subjects
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp, applied


@pytest.fixture
async def deployment(nc: NatsClient, subject_prefix: str) -> Subjects:
    """The streams of a one-shard deployment (memory storage, as fast_settings has it), and no daemon."""
    await ensure_streams(nc.jetstream(), fast_settings(subject_prefix))
    return Subjects(subject_prefix)


async def store(nc: NatsClient, names: Subjects, wk: WorkspacePk, cs: ChangeSetId, value: int = 1) -> str:
    """A request stored in its stream as a client stores it, but without its task (as after a daemon let go)."""
    request = EnqueueUpdatesRequest(
        id=RequestId.new(),
        workspace_id=wk,
        change_set_id=cs,
        updates=InlineUpdates(updates=[SetLiteral(path="/a", value=value)]),
    )
    headers, body = ENQUEUE_UPDATES_REQUEST.encode(request)
    await nc.jetstream().publish(names.requests(wk, cs), body, headers=headers, stream=names.requests_stream)
    return str(request.id)


async def has_task(nc: NatsClient, names: Subjects, wk: WorkspacePk, cs: ChangeSetId) -> bool:
    try:
        await nc.jetstream().get_last_msg(names.tasks_stream, names.task(wk, cs))
    except NotFoundError:
        return False
    return True


async def stored_pause(js: JetStreamContext, subjects: Subjects, key: str) -> Pause | None:
    kv = await js.key_value(subjects.pauses_bucket)
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    return Pause.decode(entry.value or b"")


async def queued_ids(nc: NatsClient, names: Subjects, wk: WorkspacePk, cs: ChangeSetId) -> list[str | None]:
    js, subject, seq = nc.jetstream(), names.requests(wk, cs), 0
    found: list[str | None] = []
    while True:
        try:
            msg = await js.get_msg(names.requests_stream, seq=seq + 1, subject=subject, next=True)
        except NotFoundError:
            return found
        seq = int(msg.seq or 0)
        found.append(h.get_header(msg.headers, h.NATS_MSG_ID))


@pytest.fixture
async def held_task(nc: NatsClient, deployment: Subjects) -> AsyncIterator[Any]:
    """``await hold()`` takes the one waiting task from the tasks consumer without acking it, as a daemon owning
    its change set holds it; it returns the message (``await msg.ack()`` lets go)."""
    sub = await nc.jetstream().pull_subscribe_bind(deployment.tasks_consumer, stream=deployment.tasks_stream)

    async def hold() -> Msg:
        (msg,) = await sub.fetch(1, timeout=5)
        return msg

    yield hold
    await sub.unsubscribe()


# -- pause and resume ------------------------------------------------------------------------------------------------
async def test_pause_writes_the_key_once_and_resume_deletes_it(nc: NatsClient, deployment: Subjects) -> None:
    js = nc.jetstream()
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    assert await pause_of(nc, deployment, wk, cs) == (None, None)  # no bucket yet: nothing is paused

    first = await pause_change_set(nc, deployment, wk, cs, "deploying a fix")
    assert (first.already, first.let_go, first.pause.cause, first.pause.reason) == (
        False,
        None,
        "operator",
        "deploying a fix",
    )
    assert await stored_pause(js, deployment, change_set_key(wk, cs)) == first.pause
    # Created with the deployment's storage and replicas: those of its requests stream (memory, 1).
    bucket = await js.stream_info(f"KV_{deployment.pauses_bucket}")
    assert (bucket.config.storage, bucket.config.num_replicas) == (StorageType.MEMORY, 1)

    again = await pause_change_set(nc, deployment, wk, cs, "another reason")
    assert again.already and again.pause == first.pause  # the first pause is kept, since and all
    assert await stored_pause(js, deployment, change_set_key(wk, cs)) == first.pause
    assert await pause_of(nc, deployment, wk, cs) == (first.pause, None)

    resumed = await resume_change_set(nc, deployment, wk, cs)
    assert resumed.was == first.pause and resumed.workspace_pause is None
    assert await stored_pause(js, deployment, change_set_key(wk, cs)) is None
    assert await pause_of(nc, deployment, wk, cs) == (None, None)
    assert (await resume_change_set(nc, deployment, wk, cs)).was is None  # not paused: not an error

    # Paused again after a resume (the key was deleted, not absent): a new pause.
    third = await pause_change_set(nc, deployment, wk, cs, "later")
    assert not third.already and third.pause.reason == "later"


async def test_pausing_where_no_deployment_exists_is_one_refusal(nc: NatsClient, subject_prefix: str) -> None:
    with pytest.raises(RebaserRefused, match="no rebaser deployment"):
        await pause_change_set(nc, Subjects(subject_prefix), WorkspacePk.new(), ChangeSetId.new(), "x")


async def test_resume_gives_a_task_only_when_requests_are_queued(
    nc: NatsClient, deployment: Subjects
) -> None:
    wk, busy, idle = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
    await store(nc, deployment, wk, busy)
    for cs in (busy, idle):
        await pause_change_set(nc, deployment, wk, cs, "x")

    resumed = await resume_change_set(nc, deployment, wk, busy)
    assert (resumed.queued, resumed.tasks_published, resumed.tasks_existing) == (1, 1, 0)
    assert await has_task(nc, deployment, wk, busy)
    again = await resume_change_set(nc, deployment, wk, busy)  # it has one already: 10077 is fine
    assert (again.queued, again.tasks_published, again.tasks_existing) == (1, 0, 1)

    quiet = await resume_change_set(nc, deployment, wk, idle)
    assert (quiet.queued, quiet.tasks_published) == (0, 0)
    assert not await has_task(nc, deployment, wk, idle)


async def test_a_change_set_resumed_while_its_workspace_is_paused_says_so(
    nc: NatsClient, deployment: Subjects
) -> None:
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    ws = await pause_workspace(nc, deployment, wk, "maintenance")
    assert ws.change_set_id is None and ws.let_go is None
    assert await stored_pause(nc.jetstream(), deployment, workspace_key(wk)) == ws.pause
    await pause_change_set(nc, deployment, wk, cs, "own")
    own, of_workspace = await pause_of(nc, deployment, wk, cs)
    assert own is not None and own.reason == "own" and of_workspace == ws.pause

    resumed = await resume_change_set(nc, deployment, wk, cs)
    assert resumed.workspace_pause == ws.pause  # still held by its workspace
    assert await pause_of(nc, deployment, wk, cs) == (None, ws.pause)
    assert (await pause_workspace(nc, deployment, wk, "again")).already


async def test_workspace_resume_tasks_every_queued_change_set_of_it_and_none_of_another(
    nc: NatsClient, deployment: Subjects
) -> None:
    wk, other = WorkspacePk.new(), WorkspacePk.new()
    queued = [ChangeSetId.new() for _ in range(3)]
    idle, on_its_own, elsewhere = ChangeSetId.new(), ChangeSetId.new(), ChangeSetId.new()
    for cs in (*queued, on_its_own):
        await store(nc, deployment, wk, cs)
    await store(nc, deployment, other, elsewhere)
    await pause_workspace(nc, deployment, wk, "maintenance")
    await pause_workspace(nc, deployment, other, "maintenance")
    await pause_change_set(nc, deployment, wk, on_its_own, "its own")

    resumed = await resume_workspace(nc, deployment, wk)
    assert resumed.was is not None and resumed.was.reason == "maintenance"
    assert (resumed.queued, resumed.tasks_published, resumed.left_to_sweep, resumed.still_paused) == (
        3,
        3,
        0,
        1,
    )
    for cs in queued:
        assert await has_task(nc, deployment, wk, cs)
    for w, cs in ((wk, idle), (wk, on_its_own), (other, elsewhere)):
        assert not await has_task(nc, deployment, w, cs), cs
    listed = {(p.workspace_id, p.change_set_id) for p in await list_pauses(nc, deployment)}
    assert listed == {(str(other), None), (str(wk), str(on_its_own))}


async def test_workspace_resume_finds_queued_change_sets_in_every_shard(
    nc: NatsClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    js = nc.jetstream()
    layout = await init_layout(js, settings.subjects, streams=3, mode=None, who="test", storage="memory")
    await ensure_streams(js, settings, shards=range(3), streams=3)
    subjects, wk = settings.subjects, WorkspacePk.new()
    change_sets: dict[int, ChangeSetId] = {}
    while len(change_sets) < 3:  # one change set in each shard
        cs = ChangeSetId.new()
        change_sets.setdefault(layout.shard_of(wk, cs), cs)
    for shard, cs in change_sets.items():
        await store(nc, subjects.for_shard(shard), wk, cs)
    await pause_workspace(nc, subjects, wk, "x")

    resumed = await resume_workspace(nc, subjects, wk)
    assert (resumed.queued, resumed.tasks_published) == (3, 3)
    for shard, cs in change_sets.items():
        assert await has_task(nc, subjects.for_shard(shard), wk, cs), shard


def test_the_sync_client_pauses_resumes_and_skips(nats_url: str, subject_prefix: str) -> None:
    async def setup() -> tuple[WorkspacePk, ChangeSetId, str]:
        nc = await nats.connect(nats_url)
        try:
            await ensure_streams(nc.jetstream(), fast_settings(subject_prefix))
            wk, cs = WorkspacePk.new(), ChangeSetId.new()
            return wk, cs, await store(nc, Subjects(subject_prefix), wk, cs)
        finally:
            await nc.close()

    wk, cs, rid = asyncio.run(setup())
    with SyncRebaserClient(nats_url, prefix=subject_prefix) as client:
        paused = client.pause_change_set(wk, cs, "sync", wait=5)
        assert paused.pause.reason == "sync" and paused.let_go
        assert client.pause_of(str(wk), str(cs)) == (paused.pause, None)
        assert client.pause_workspace(wk, "ws").change_set_id is None
        assert client.skip_request(wk, cs, rid).request_id == rid
        assert client.resume_change_set(wk, cs).was == paused.pause
        resumed = client.resume_workspace(wk)
        assert resumed.was is not None and resumed.queued == 0
        assert client.pause_of(wk, cs) == (None, None)


# -- waiting for the owner to let go ---------------------------------------------------------------------------------
async def test_pause_waits_until_no_daemon_holds_the_change_set(
    nc: NatsClient, client: RebaserClient, deployment: Subjects, held_task: Any
) -> None:
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    await client.enqueue_updates(wk, cs, [SetLiteral(path="/a", value=1)])  # with its task
    task = await held_task()  # a daemon owns it

    with pytest.raises(StillHeld, match="still holds") as raised:
        await pause_change_set(nc, deployment, wk, cs, "x", wait=0.3)
    assert isinstance(raised.value, RebaserTimeout)
    assert (await pause_of(nc, deployment, wk, cs))[0] is not None  # paused all the same
    with pytest.raises(StillHeld):
        await pause_workspace(nc, deployment, wk, "x", wait=0.3)

    waiting = asyncio.create_task(client.pause_change_set(wk, cs, "y", wait=10))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await task.ack()  # the owner lets it go
    result = await asyncio.wait_for(waiting, 10)
    assert result.already and result.let_go is True
    assert (await pause_workspace(nc, deployment, wk, "x", wait=5)).let_go is True


# -- skip ------------------------------------------------------------------------------------------------------------
async def test_skip_refuses_unless_paused_and_first_in_line(nc: NatsClient, deployment: Subjects) -> None:
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    await pause_change_set(nc, deployment, wk, cs, "x")
    with pytest.raises(NotFirstInLine, match="nothing is queued"):
        await skip_request(nc, deployment, wk, cs, RequestId.new())
    await resume_change_set(nc, deployment, wk, cs)
    first, second = await store(nc, deployment, wk, cs, 1), await store(nc, deployment, wk, cs, 2)

    with pytest.raises(NotPaused, match="pause it first"):
        await skip_request(nc, deployment, wk, cs, first)
    await pause_change_set(nc, deployment, wk, cs, "x")
    with pytest.raises(NotFirstInLine, match=first) as raised:
        await skip_request(nc, deployment, wk, cs, second)
    assert (raised.value.found, raised.value.seq) == (first, 1)
    assert await queued_ids(nc, deployment, wk, cs) == [first, second]  # nothing done
    assert (await dead_letters(nc, deployment))[0] == 0


async def test_skip_moves_the_first_request_to_the_dead_letters(
    nc: NatsClient, client: RebaserClient, deployment: Subjects, held_task: Any
) -> None:
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    first = str(await client.enqueue_updates(wk, cs, [SetLiteral(path="/a", value=1)]))
    second = await store(nc, deployment, wk, cs, 2)
    await pause_workspace(nc, deployment, wk, "x")  # its workspace's pause holds it too
    task = await held_task()
    with pytest.raises(HeldByDaemon, match="still holds it"):
        await skip_request(nc, deployment, wk, cs, first)
    await task.ack()

    skipped = await client.skip_request(wk, cs, first)
    assert (skipped.request_id, skipped.seq, skipped.deleted, skipped.duplicate) == (first, 1, True, False)
    assert await queued_ids(nc, deployment, wk, cs) == [second]
    total, (letter,) = await dead_letters(nc, deployment, workspace_id=wk, change_set_id=cs)
    assert total == 1 and letter.seq == skipped.dead_letter_seq
    assert (letter.reason, letter.request_id, letter.original_seq) == (SKIP_REASON, first, 1)
    assert str(check_replayable(letter).id) == first  # the whole request is kept: it can be replayed
    with pytest.raises(NotFirstInLine, match=second):  # skipping it again: it is not first any more
        await skip_request(nc, deployment, wk, cs, first)
    assert (await skip_request(nc, deployment, wk, cs, second.lower())).request_id == second
    assert await queued_ids(nc, deployment, wk, cs) == []


# -- show and status -------------------------------------------------------------------------------------------------
async def test_show_and_status_report_pauses_with_what_is_queued(
    nc: NatsClient, deployment: Subjects
) -> None:
    wk, cs, other = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
    for _ in range(2):
        await store(nc, deployment, wk, cs)
    await store(nc, deployment, wk, other)
    before = await change_set_report(nc, deployment, wk, cs)
    assert before is not None and before.pause is None and before.workspace_pause is None
    assert (await status_report(nc, deployment)).pauses == ()

    own = (await pause_change_set(nc, deployment, wk, cs, "own")).pause
    ws = (await pause_workspace(nc, deployment, wk, "all")).pause
    report = await change_set_report(nc, deployment, wk, cs)
    assert report is not None and (report.pause, report.workspace_pause, report.queued_total) == (own, ws, 2)
    # A change set JetStream knows nothing else of is reported while it is paused.
    lonely = ChangeSetId.new()
    assert await change_set_report(nc, deployment, wk, lonely) is None
    await pause_change_set(nc, deployment, wk, lonely, "why not")
    shown = await change_set_report(nc, deployment, wk, lonely)
    assert shown is not None and shown.paused and shown.queued_total == 0

    status = await status_report(nc, deployment)
    lines = {(p.workspace_id, p.change_set_id): (p.pause.reason, p.queued) for p in status.pauses}
    assert lines == {
        (str(wk), str(cs)): ("own", 2),
        (str(wk), None): ("all", 3),
        (str(wk), str(lonely)): ("why not", 0),
    }
    assert status.pauses_total == 3 and not status.pauses_more
    assert len((await status_report(nc, deployment, limit=1)).pauses) == 1


# -- the command line ------------------------------------------------------------------------------------------------
async def rebaser(nats_url: str, prefix: str, *args: str, input: str | None = None) -> Result:
    argv = [*args, "--nats-url", nats_url, "--prefix", prefix]
    return await asyncio.to_thread(CliRunner().invoke, cli, argv, input=input, catch_exceptions=False)


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def one_line_error(result: Result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    return errors[0]


async def test_cli_pause_show_status_skip_resume(
    nc: NatsClient, nats_url: str, subject_prefix: str, deployment: Subjects
) -> None:
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    first, second = await store(nc, deployment, wk, cs, 1), await store(nc, deployment, wk, cs, 2)
    w, c = str(wk), str(cs)

    paused = ok_json(
        await rebaser(nats_url, subject_prefix, "change-set", "pause", w, c, "--reason", "bad data", "--json")
    )
    assert (paused["already_paused"], paused["let_go"], paused["pause"]["reason"]) == (
        False,
        True,
        "bad data",
    )
    text = await rebaser(nats_url, subject_prefix, "change-set", "pause", w, c, "--no-wait")
    assert text.exit_code == 0 and "was paused already" in text.output and "bad data" in text.output
    ws = await rebaser(nats_url, subject_prefix, "workspace", "pause", w, "--reason", "freeze")
    assert ws.exit_code == 0 and f"paused workspace {w} (freeze); no daemon holds it" in ws.output

    shown = ok_json(await rebaser(nats_url, subject_prefix, "change-set", "show", w, c, "--json"))
    assert shown["paused"] and shown["queued_total"] == 2
    assert [(p["via"], p["cause"], p["reason"]) for p in shown["pauses"]] == [
        ("change_set", "operator", "bad data"),
        ("workspace", "operator", "freeze"),
    ]
    table = await rebaser(nats_url, subject_prefix, "change-set", "show", w, c)
    assert "paused" in table.output and "bad data" in table.output and "with its workspace" in table.output
    status = ok_json(await rebaser(nats_url, subject_prefix, "status", "--json"))
    assert status["pauses_total"] == 2
    assert {(p["change_set_id"], p["reason"], p["queued"]) for p in status["pauses"]} == {
        (c, "bad data", 2),
        (None, "freeze", 2),
    }
    table = await rebaser(nats_url, subject_prefix, "status")
    assert "paused change sets and workspaces: 2" in table.output and "freeze" in table.output

    # skip: asks first; refuses what is not first in line, naming the first one; then moves it.
    not_first = await rebaser(nats_url, subject_prefix, "change-set", "skip", w, c, second, "--yes")
    assert first in one_line_error(not_first) and "NotFirstInLine" in not_first.output
    declined = await rebaser(nats_url, subject_prefix, "change-set", "skip", w, c, first, input="n\n")
    assert first in declined.output and "not confirmed" in one_line_error(declined)
    assert await queued_ids(nc, deployment, wk, cs) == [first, second]
    skipped = ok_json(
        await rebaser(nats_url, subject_prefix, "change-set", "skip", w, c, first, "--yes", "--json")
    )
    assert (skipped["request_id"], skipped["seq"], skipped["deleted"]) == (first, 1, True)
    assert await queued_ids(nc, deployment, wk, cs) == [second]
    listed = ok_json(await rebaser(nats_url, subject_prefix, "dlq", "list", "--json"))
    assert [(d["request_id"], d["reason"]) for d in listed["dead_letters"]] == [(first, SKIP_REASON)]

    resumed = await rebaser(nats_url, subject_prefix, "change-set", "resume", w, c)
    assert resumed.exit_code == 0, resumed.output
    assert f"resumed change set {w}/{c}" in resumed.output and "gave it a task" in resumed.output
    assert "its workspace is paused" in resumed.output
    data = ok_json(await rebaser(nats_url, subject_prefix, "workspace", "resume", w, "--json"))
    assert data["was"]["reason"] == "freeze" and (data["queued"], data["tasks_existing"]) == (1, 1)
    again = await rebaser(nats_url, subject_prefix, "workspace", "resume", w)
    assert again.exit_code == 0 and f"workspace {w} was not paused" in again.output
    not_paused = await rebaser(nats_url, subject_prefix, "change-set", "skip", w, c, second, "--yes")
    assert "pause it first" in one_line_error(not_paused)
    assert ok_json(await rebaser(nats_url, subject_prefix, "status", "--json"))["pauses"] == []


async def test_cli_pause_wait_times_out_while_a_daemon_holds_it(
    nc: NatsClient,
    client: RebaserClient,
    nats_url: str,
    subject_prefix: str,
    deployment: Subjects,
    held_task: Any,
) -> None:
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    await client.enqueue_updates(wk, cs, [SetLiteral(path="/a", value=1)])
    task = await held_task()
    held = await rebaser(
        nats_url, subject_prefix, "change-set", "pause", str(wk), str(cs), "--timeout", "0.3"
    )
    assert "StillHeld" in one_line_error(held) and "is paused, but" in held.output
    await task.ack()
    bad = await rebaser(nats_url, subject_prefix, "change-set", "skip", str(wk), "nope", str(RequestId.new()))
    assert bad.exit_code == 2 and "not a ULID" in bad.output


# -- with a daemon ---------------------------------------------------------------------------------------------------
async def test_a_paused_change_set_is_not_applied_until_resumed(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon:
        subjects = Subjects(subject_prefix)
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=0)], timeout=10)
        await client.pause_change_set(wk, cs, "hold on", wait=10)
        # The owner's letting go is counted by the time it no longer lists the change set.
        await wait_for(lambda: all(o.change_set_id != cs for o in daemon.owned), timeout=20)
        before = daemon.stats.tasks_paused
        rid = str(await client.enqueue_updates(wk, cs, [SetLiteral(path="/a", value=1)]))
        # Its task was taken and let go untouched (a daemon that applied it would have done so by then).
        await wait_for(
            lambda: daemon.stats.tasks_paused > before, timeout=20, message="the task let go while paused"
        )
        assert rid not in await applied(daemon.store, wk, cs)
        report = await change_set_report(nc, subjects, wk, cs)
        assert report is not None and report.paused and [q.request_id for q in report.queued] == [rid]

        await client.resume_change_set(wk, cs)
        await wait_for(lambda: _applied(daemon, wk, cs, rid), timeout=20)


async def _applied(daemon: Any, wk: WorkspacePk, cs: ChangeSetId, rid: str) -> bool:
    return rid in await applied(daemon.store, wk, cs)
