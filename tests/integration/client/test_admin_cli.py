"""The admin commands against a real nats-server and a running daemon: status, change-set show and purge, dlq list,
show, replay and drop, wait; and one line for the operator's mistakes."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import nats.errors
import pytest
from click.testing import CliRunner, Result
from nats.aio.client import Client as NatsClient
from nats.js.manager import JetStreamManager

from rebaser_client import RebaserClient, RebaserUnavailable, SetLiteral
from rebaser_client.admin.cli.main import main as cli
from rebaser_client.admin.dead_letters import dead_letters
from rebaser_client.admin.repairs import replay_dead_letter
from rebaser_core import headers as h
from rebaser_core.api import EnqueueUpdatesRequest, InlineUpdates
from rebaser_core.embedded import NatsServer
from rebaser_core.errors import UnprocessableError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.nats.tasks import publish_task
from rebaser_core.subjects import Subjects
from rebaser_core.testing import wait_for
from rebaser_server.app import Applied, AppState, ChangeSet
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.testing import CheckpointGate, fast_settings, running_daemon
from tests.support.apps import RecordingApp, applied


async def rebaser(nats_url: str, prefix: str, *args: str, input: str | None = None) -> Result:
    """``rebaser ARGS --nats-url … --prefix …`` in a thread (the command runs its own event loop)."""
    argv = [*args, "--nats-url", nats_url, "--prefix", prefix]
    return await asyncio.to_thread(CliRunner().invoke, cli, argv, input=input, catch_exceptions=False)


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def one_line_error(result: Result) -> str:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    return errors[0]


class Refusing(RecordingApp):
    """Refuses (dead-letters) requests that set ``/maybe`` while ``refuse`` is true."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = True

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        updates = request.updates.updates if isinstance(request.updates, InlineUpdates) else []
        if self.refuse and any(u.path == "/maybe" for u in updates):
            raise UnprocessableError("refused for now")
        return await super().apply(change_set, state, request)


async def test_change_set_show_queued_then_owned_then_done(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    await ensure_streams(
        nc.jetstream(), settings
    )  # stored before any daemon runs: queued, waiting for an owner
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    ids = [str(await client.enqueue_updates(wk, cs, [SetLiteral(path="/dvu", value=n)])) for n in range(3)]

    shown = ok_json(await rebaser(nats_url, subject_prefix, "change-set", "show", str(wk), str(cs), "--json"))
    assert (shown["task"], shown["record"], shown["queued_total"]) == ("waiting", None, 3)
    assert [q["request_id"] for q in shown["queued"]] == ids
    assert all(
        q["age_seconds"] >= 0 and not q["processed"] and q["summary"] == "1 updates" for q in shown["queued"]
    )
    table = await rebaser(nats_url, subject_prefix, "change-set", "show", str(wk), str(cs))
    assert table.exit_code == 0, table.output
    assert (
        "queued requests: 3" in table.output
        and ids[0] in table.output
        and "waiting for an owner" in table.output
    )

    gate = CheckpointGate("applied")  # the daemon stops right after its first commit, owning the change set
    async with running_daemon(nc, settings, RecordingApp(), hooks=gate) as daemon:
        await gate.wait_reached()
        shown = ok_json(
            await rebaser(nats_url, subject_prefix, "change-set", "show", str(wk), str(cs), "--json")
        )
        record = shown["record"]
        assert shown["task"] == "owned" and record["owner"] == daemon.owner and record["epoch"] == 1
        assert record["dvu_pending"] and shown["queued_total"] == 3
        assert [q["processed"] for q in shown["queued"]] == [
            q["seq"] <= record["applied_seq"] for q in shown["queued"]
        ]
        status = ok_json(await rebaser(nats_url, subject_prefix, "status", "--json"))
        assert status["owners"] == {daemon.owner: 1}
        (line,) = status["change_sets"]
        assert (line["change_set_id"], line["queued"], line["task"]) == (str(cs), 3, "owned")
        gate.release()

        await client.wait_settled(wk, cs, timeout=20)
        shown = ok_json(
            await rebaser(nats_url, subject_prefix, "change-set", "show", str(wk), str(cs), "--json")
        )
        assert shown["queued_total"] == 0 and not shown["record"]["dvu_pending"]
        assert [r["request_id"] for r in shown["last_replies"]] == ids[::-1]  # newest first
        assert {r["kind"] for r in shown["last_replies"]} == {"success"}


async def test_dlq_replay_applies_the_request_under_a_new_id(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str
) -> None:
    app = Refusing()
    async with running_daemon(nc, fast_settings(subject_prefix), app) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        refused = await client.enqueue_updates_with_reply(
            wk, cs, [SetLiteral(path="/maybe", value=1)], timeout=10
        )
        assert refused.status.kind == "error" and "refused for now" in refused.status.message

        listed = ok_json(await rebaser(nats_url, subject_prefix, "dlq", "list", "--json"))
        (letter,) = listed["dead_letters"]
        assert listed["total"] == 1 and letter["request_id"] == str(refused.id)
        assert (letter["workspace_id"], letter["change_set_id"]) == (str(wk), str(cs))
        assert "refused for now" in letter["reason"]
        seq = str(letter["seq"])
        shown = ok_json(await rebaser(nats_url, subject_prefix, "dlq", "show", seq, "--json"))
        assert (
            shown["request"]["id"] == str(refused.id)
            and shown["request"]["updates"]["updates"][0]["path"] == "/maybe"
        )
        # Where the app raised it: the last of the app's frames is Refusing.apply, in the reply and the letter.
        assert re.search(r"\(at test_admin_cli\.py:\d+ in apply\)$", refused.status.message)
        assert shown["trace"][-1].startswith("test_admin_cli.py:") and shown["trace"][-1].endswith("in apply")
        table = await rebaser(nats_url, subject_prefix, "dlq", "show", seq)
        assert table.exit_code == 0 and "raised in the app" in table.output, table.output

        app.refuse = False  # the cause is fixed: replay it
        replayed = ok_json(await rebaser(nats_url, subject_prefix, "dlq", "replay", seq, "--yes", "--json"))
        (result,) = replayed["replayed"]
        assert result["original_id"] == str(refused.id) and result["request_id"] != str(refused.id)
        assert not result["duplicate"]
        await client.wait_settled(wk, cs, timeout=20)
        assert await applied(daemon.store, wk, cs) == [result["request_id"]]
        assert ok_json(await rebaser(nats_url, subject_prefix, "dlq", "list", "--json"))["total"] == 0

        # The dead letter is gone: replaying it again is one line, and nothing is applied twice.
        again = await rebaser(nats_url, subject_prefix, "dlq", "replay", seq)
        assert f"no dead letter at sequence {seq}" in one_line_error(again)
        assert await applied(daemon.store, wk, cs) == [result["request_id"]]


async def test_dlq_drop_and_replay_all(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str
) -> None:
    app = Refusing()
    async with running_daemon(nc, fast_settings(subject_prefix), app) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        for n in range(3):
            await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/maybe", value=n)], timeout=10)
        listed = ok_json(await rebaser(nats_url, subject_prefix, "dlq", "list", "--json"))
        seqs = [d["seq"] for d in listed["dead_letters"]]
        assert len(seqs) == 3
        assert one_line_error(await rebaser(nats_url, subject_prefix, "dlq", "drop", "--all", input="n\n"))
        assert ok_json(
            await rebaser(nats_url, subject_prefix, "dlq", "drop", str(seqs[0]), "--yes", "--json")
        ) == {"dropped": 1}
        app.refuse = False
        replayed = ok_json(
            await rebaser(
                nats_url, subject_prefix, "dlq", "replay", "--all", "--yes", "--json",
                "--workspace", str(wk), "--change-set", str(cs),
            )
        )  # fmt: skip
        new_ids = [r["request_id"] for r in replayed["replayed"]]
        assert len(new_ids) == 2
        await client.wait_settled(wk, cs, timeout=20)
        assert await applied(daemon.store, wk, cs) == new_ids  # in dead-letter order
        assert ok_json(await rebaser(nats_url, subject_prefix, "dlq", "list", "--json"))["total"] == 0


async def test_replay_and_drop_ask_first_and_a_missing_dead_letter_is_one_line_for_all(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str
) -> None:
    app = Refusing()
    async with running_daemon(nc, fast_settings(subject_prefix), app) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/maybe", value=1)], timeout=10)
        (letter,) = ok_json(await rebaser(nats_url, subject_prefix, "dlq", "list", "--json"))["dead_letters"]
        seq = str(letter["seq"])
        app.refuse = False

        # Replay asks, as drop does; "no" replays nothing.
        for command in ("replay", "drop"):
            refused = await rebaser(nats_url, subject_prefix, "dlq", command, seq, input="n\n")
            assert f"dead letter {seq}" in refused.output  # the question names it
            assert "not confirmed (pass --yes" in one_line_error(refused)
        assert ok_json(await rebaser(nats_url, subject_prefix, "dlq", "list", "--json"))["total"] == 1
        assert await applied(daemon.store, wk, cs) == []

        replayed = await rebaser(nats_url, subject_prefix, "dlq", "replay", seq, input="y\n")
        assert replayed.exit_code == 0 and f"dead letter {seq}: replayed as request" in replayed.output
        await client.wait_settled(wk, cs, timeout=20)
        assert len(await applied(daemon.store, wk, cs)) == 1

        # Gone: show, replay and drop say the same line, ask nothing (no input: a question would abort), do nothing.
        missing = f"Error: no dead letter at sequence {seq} (see `rebaser dlq list`)"
        for command in ("show", "replay", "drop"):
            assert one_line_error(await rebaser(nats_url, subject_prefix, "dlq", command, seq)) == missing
        # With another that is there, still nothing is done.
        await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/maybe", value=2)], timeout=10)
        app.refuse = True
        await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/maybe", value=3)], timeout=10)
        (other,) = ok_json(await rebaser(nats_url, subject_prefix, "dlq", "list", "--json"))["dead_letters"]
        both = (str(other["seq"]), seq)
        assert (
            one_line_error(await rebaser(nats_url, subject_prefix, "dlq", "drop", *both, "--yes")) == missing
        )
        assert ok_json(await rebaser(nats_url, subject_prefix, "dlq", "list", "--json"))["total"] == 1

        dropped = await rebaser(nats_url, subject_prefix, "dlq", "drop", str(other["seq"]), "--yes")
        assert dropped.exit_code == 0 and dropped.output == "dropped 1 dead letter\n", dropped.output


async def test_change_set_purge_removes_what_is_queued(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    await ensure_streams(nc.jetstream(), settings)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    for n in range(4):
        await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=n)])
    refused = await rebaser(nats_url, subject_prefix, "change-set", "purge", str(wk), str(cs), input="n\n")
    assert "not confirmed" in one_line_error(refused)
    purged = ok_json(
        await rebaser(nats_url, subject_prefix, "change-set", "purge", str(wk), str(cs), "--yes", "--json")
    )
    assert (purged["removed"], purged["task"]) == (4, "waiting")  # no daemon yet: the task waits for one
    app = RecordingApp()
    async with running_daemon(nc, settings, app) as daemon:
        # The waiting task finds nothing queued and no record: it goes, nothing applied (taken and let go; the fair
        # intake drops it untaken, its workspace having no request and no consumer).
        async def task_gone() -> bool:
            return (await nc.jetstream().stream_info(settings.subjects.tasks_stream)).state.messages == 0

        await wait_for(task_gone, message="the empty task gone")
        assert daemon.stats.tasks_dropped == (0 if daemon.layout.intake == "fair" else 1)
        answer = await client.wait_settled(wk, cs, timeout=10)
        assert answer.settled and answer.applied_seq == 0
        assert await applied(daemon.store, wk, cs) == []


async def test_wait_command(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str
) -> None:
    app = RecordingApp()
    async with running_daemon(nc, fast_settings(subject_prefix), app):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        await client.enqueue_updates(wk, cs, [SetLiteral(path="/dvu", value=1)])
        answer = ok_json(
            await rebaser(nats_url, subject_prefix, "wait", str(wk), str(cs), "--timeout", "20", "--json")
        )
        assert answer["settled"] and not answer["dvu_pending"] and not answer["queued"]
        assert app.dvu_runs[str(ChangeSet(wk, cs))] == 1
        text = await rebaser(nats_url, subject_prefix, "wait", str(wk), str(cs))
        assert text.exit_code == 0 and text.output.startswith("settled: ")


async def test_wait_on_a_change_set_nothing_is_known_of_says_so(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), SnapshotApp()):
        wk, cs, fork = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
        result = await rebaser(nats_url, subject_prefix, "wait", str(wk), str(cs), "--timeout", "10")
        assert result.exit_code == 1
        assert f"nothing is known of change set {cs} in workspace {wk}" in one_line_error(result)
        # A fork has a record of its own and no request of its own: known, and settled.
        assert (await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=1)])).ok
        await client.fork_change_set(wk, fork, cs)
        result = await rebaser(nats_url, subject_prefix, "wait", str(wk), str(fork), "--timeout", "10")
        assert result.exit_code == 0 and result.output.startswith("settled: "), result.output


async def test_wait_with_a_timeout_that_is_not_a_number_is_one_line(
    nats_url: str, subject_prefix: str
) -> None:
    wk, cs = str(WorkspacePk.new()), str(ChangeSetId.new())
    result = await rebaser(nats_url, subject_prefix, "wait", wk, cs, "--timeout", "nan")
    assert "'nan' must be a number of seconds from 0 to 604800" in one_line_error(result)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["change-set", "show", "not-an-id", "01J0000000000000000000000A"], "is not a ULID"),
        (["dlq", "show", "0"], "0 is not in the range"),
        (["dlq", "replay"], "give dead-letter sequences, or --all"),
        (
            ["dlq", "list", "--workspace", "01J0000000000000000000000A"],
            "--workspace and --change-set go together",
        ),
    ],
)
async def test_bad_input_is_one_line(
    args: list[str], expected: str, nats_url: str, subject_prefix: str
) -> None:
    result = await rebaser(nats_url, subject_prefix, *args)
    assert result.exit_code == 2 and expected in result.output and "Traceback" not in result.output


async def test_unknown_things_and_unreachable_nats_are_one_line(
    nc: NatsClient, nats_url: str, subject_prefix: str
) -> None:
    wk, cs = str(WorkspacePk.new()), str(ChangeSetId.new())
    for args in (["change-set", "show", wk, cs], ["dlq", "list"], ["dlq", "show", "1"]):
        error = one_line_error(await rebaser(nats_url, subject_prefix, *args))
        assert f"no rebaser deployment with prefix {subject_prefix} here" in error, args
    await ensure_streams(nc.jetstream(), fast_settings(subject_prefix))
    assert "is unknown" in one_line_error(
        await rebaser(nats_url, subject_prefix, "change-set", "show", wk, cs)
    )
    assert "no dead letter at sequence 7" in one_line_error(
        await rebaser(nats_url, subject_prefix, "dlq", "show", "7")
    )
    for args in (["status"], ["change-set", "show", wk, cs], ["dlq", "list"], ["wait", wk, cs]):
        error = one_line_error(await rebaser("nats://127.0.0.1:1", subject_prefix, *args))
        assert "cannot connect to NATS at nats://127.0.0.1:1" in error


async def test_purge_while_a_daemon_owns_the_change_set(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    await ensure_streams(nc.jetstream(), settings)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    ids = [str(await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=n)])) for n in range(20)]
    gate = CheckpointGate("applied")  # the owner pauses after its first commit, with the rest still queued
    async with running_daemon(nc, settings, RecordingApp(), hooks=gate) as daemon:
        await gate.wait_reached()
        result = await rebaser(nats_url, subject_prefix, "change-set", "purge", str(wk), str(cs), "--yes")
        assert result.exit_code == 0, result.output
        assert result.output.startswith("removed ") and "a daemon owns the change set" in result.output
        nothing = await rebaser(nats_url, subject_prefix, "change-set", "purge", str(wk), str(cs), "--yes")
        assert nothing.output.startswith(f"nothing queued for {wk}/{cs}")
        gate.release()
        answer = await client.wait_settled(wk, cs, timeout=20)
        assert answer.settled
        # What the owner had already read was applied, in order; nothing after a purged request was.
        done = await applied(daemon.store, wk, cs)
        assert done and done == ids[: len(done)]


async def test_a_replay_cut_short_before_the_delete_is_not_applied_twice(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = Refusing()
    subjects = Subjects(subject_prefix)
    async with running_daemon(nc, fast_settings(subject_prefix), app) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/maybe", value=1)], timeout=10)
        _, (letter,) = await dead_letters(nc, subjects)
        app.refuse = False

        async def lost(self: Any, stream: str, seq: int) -> bool:
            raise nats.errors.TimeoutError  # the replay is stored, then the tool dies or NATS goes away

        with monkeypatch.context() as patched:
            patched.setattr(JetStreamManager, "delete_msg", lost)
            with pytest.raises(RebaserUnavailable, match="could not be deleted"):
                await replay_dead_letter(nc, subjects, letter.seq)
        again = await replay_dead_letter(nc, subjects, letter.seq)  # the operator runs it again
        assert again.duplicate  # the same derived id: JetStream stored it once
        await client.wait_settled(wk, cs, timeout=20)
        assert await applied(daemon.store, wk, cs) == [again.request_id]
        assert (await dead_letters(nc, subjects))[0] == 0


async def test_a_dead_letter_that_cannot_be_decoded_is_not_replayed(
    nc: NatsClient, nats_url: str, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, RecordingApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        headers = {
            h.CONTENT_TYPE: "application/json",
            h.MESSAGE_TYPE: "EnqueueUpdatesRequest",
            h.MESSAGE_VERSION: "3",
            h.NATS_MSG_ID: str(RequestId.new()),
        }
        await nc.jetstream().publish(settings.subjects.requests(wk, cs), b"{not json", headers=headers)
        await publish_task(nc, settings.subjects.task(wk, cs))
        listed = await wait_for(
            lambda: _listed(nats_url, subject_prefix), message="the garbled request dead-lettered"
        )
        (letter,) = listed["dead_letters"]
        assert letter["request_id"] is None and "DecodeError" in letter["reason"]
        refused = await rebaser(nats_url, subject_prefix, "dlq", "replay", str(letter["seq"]))
        assert "cannot be replayed: DecodeError" in one_line_error(refused)
        shown = ok_json(await rebaser(nats_url, subject_prefix, "dlq", "show", str(letter["seq"]), "--json"))
        assert shown["request"] is None and shown["body_text"] == "{not json"  # still there, as it was


async def _listed(nats_url: str, prefix: str) -> Any:
    listed = ok_json(await rebaser(nats_url, prefix, "dlq", "list", "--json"))
    return listed if listed["total"] else None


async def test_status_shows_what_an_acknowledgement_survives(
    nc: NatsClient, nats_server: NatsServer, subject_prefix: str
) -> None:
    await ensure_streams(nc.jetstream(), fast_settings(subject_prefix, storage="file"))
    unread = ok_json(await rebaser(nats_server.url, subject_prefix, "status", "--json"))
    assert (unread["durability"]["level"], unread["durability"]["sync"]) == ("unknown", "unknown")
    assert {s["replicas"] for s in unread["streams"]} == {1}

    monitor = nats_server.monitoring_url
    assert monitor is not None
    read = ok_json(
        await rebaser(nats_server.url, subject_prefix, "status", "--json", "--nats-monitoring-url", monitor)
    )
    # The session's server runs with nats-server's default sync: every 2 minutes.
    assert (read["durability"]["level"], read["durability"]["sync"]) == ("process-crash", "every 120s")
    table = await rebaser(nats_server.url, subject_prefix, "status", "--nats-monitoring-url", monitor)
    assert table.exit_code == 0, table.output
    assert "durability: process-crash (sync every 120s, replicas 1)" in table.output
    assert "do not survive a power loss" in table.output


async def test_status_without_a_monitoring_url_shows_what_the_daemon_found(
    nc: NatsClient, nats_server: NatsServer, subject_prefix: str
) -> None:
    # The daemon reads the servers' monitoring endpoints; `rebaser status` given none said "unknown" where the daemon
    # on the same servers knew. It now shows the daemon's finding, and says whose.
    monitor = nats_server.monitoring_url
    assert monitor is not None
    settings = fast_settings(subject_prefix, storage="file", nats_monitoring_urls=(monitor,))
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        shown = ok_json(await rebaser(nats_server.url, subject_prefix, "status", "--json"))
        assert (shown["durability"]["level"], shown["durability"]["sync"]) == ("process-crash", "every 120s")
        assert shown["durability_from"].startswith(f"{daemon.owner} at ")
        table = await rebaser(nats_server.url, subject_prefix, "status")
        assert table.exit_code == 0, table.output
        assert f"as the daemon {daemon.owner} at" in table.output
        # Given the URL, the command reads it itself.
        read = ok_json(
            await rebaser(
                nats_server.url, subject_prefix, "status", "--json", "--nats-monitoring-url", monitor
            )
        )
        assert read["durability_from"] is None and read["durability"]["level"] == "process-crash"


async def test_status_counts_every_owned_change_set_whatever_the_limit(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str
) -> None:
    """The owners table counts what each daemon owns, not what ``--limit`` lists (issue 64: "50" for 202)."""
    # A long quiet period: each change set stays owned (its record names the daemon) after its request.
    settings = fast_settings(subject_prefix, quiescent_period=60)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk = WorkspacePk.new()
        targets = [ChangeSetId.new() for _ in range(4)]
        for cs in targets:
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/a", value=1)], timeout=20
            )
            assert reply.ok
        assert len(daemon.owned) == len(targets)
        status = ok_json(await rebaser(nats_url, subject_prefix, "status", "--limit", "1", "--json"))
        assert len(status["change_sets"]) == 1 and status["change_sets_total"] == len(targets)
        assert status["owners"] == {daemon.owner: len(targets)}
        table = await rebaser(nats_url, subject_prefix, "status", "--limit", "1")
        assert table.exit_code == 0, table.output
        assert re.search(rf"{re.escape(daemon.owner)}[\s│┃|]+{len(targets)}\s", table.output), table.output
