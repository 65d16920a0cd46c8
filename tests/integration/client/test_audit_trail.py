"""Issue 64: the operators' audit trail from the command line. Every action a ``rebaser`` command does is recorded
in the audit stream (who: the OS user; what, which targets, when, the outcome) and ``rebaser audit`` lists the
newest entries; an action whose record cannot be written is done all the same, and the command says the entry is
missing."""

from __future__ import annotations

import json

from nats.aio.client import Client as NatsClient
from nats.js import api as js_api

from rebaser_client._pausing import pause_of
from rebaser_client.admin.audit import cli_identity, entries
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.streams import AUDIT_MAX_MSGS, audit_stream_config
from rebaser_core.subjects import Subjects
from tests.integration.client.test_pause_admin import deployment, ok_json, rebaser, store

__all__ = ["deployment"]  # the fixture, used by name


async def test_cli_actions_are_listed_by_rebaser_audit(
    nc: NatsClient, nats_url: str, subject_prefix: str, deployment: Subjects
) -> None:
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    w, c = str(wk), str(cs)
    first = await store(nc, deployment, wk, cs, 1)
    await store(nc, deployment, wk, cs, 2)
    none_yet = ok_json(await rebaser(nats_url, subject_prefix, "audit", "--json"))
    assert none_yet == {"total": 0, "entries": []}

    ok_json(await rebaser(nats_url, subject_prefix, "change-set", "pause", w, c, "--no-wait", "--json"))
    ok_json(await rebaser(nats_url, subject_prefix, "change-set", "skip", w, c, first, "--yes", "--json"))
    ok_json(await rebaser(nats_url, subject_prefix, "change-set", "resume", w, c, "--json"))
    dropped = ok_json(await rebaser(nats_url, subject_prefix, "dlq", "drop", "--all", "--yes", "--json"))
    assert dropped == {"dropped": 1}
    # A pause made from the command line keeps who made it, as the console's does.
    ok_json(await rebaser(nats_url, subject_prefix, "workspace", "pause", w, "--no-wait", "--json"))
    own, ws_pause = await pause_of(nc, deployment, wk, cs)
    assert own is None and ws_pause is not None and ws_pause.by == cli_identity()

    listed = ok_json(await rebaser(nats_url, subject_prefix, "audit", "--json", "--limit", "4"))
    assert listed["total"] == 5
    got = [(e["what"], e["outcome"], e["targets"]) for e in listed["entries"]]
    assert got == [
        ("pause", "ok", [f"workspace {w}"]),
        ("drop", "ok", ["every dead letter"]),
        ("resume", "ok", [f"change set {w}/{c}"]),
        ("skip", "ok", [f"{w}/{c} request {first}"]),
    ]  # newest first, the oldest (the change set's pause) left out by --limit
    for entry in listed["entries"]:
        assert entry["who"] == cli_identity() and entry["who"].startswith("os:"), entry
        assert entry["source"] == "cli" and entry["at"].endswith("Z") and entry["lines"], entry
    assert listed["entries"][1]["lines"] == ["dropped 1 dead letter"]
    assert [e["seq"] for e in listed["entries"]] == [5, 4, 3, 2]

    table = await rebaser(nats_url, subject_prefix, "audit")
    assert table.exit_code == 0, table.output
    assert "the newest 5 of 5" in table.output and "skip" in table.output and first in table.output

    # A failed action is recorded as failed, with what the operator was told.
    failed = await rebaser(nats_url, subject_prefix, "change-set", "skip", w, c, first, "--yes")
    assert failed.exit_code == 1
    total, newest = await entries(nc, deployment, limit=1)
    assert total == 6 and newest[0]["what"] == "skip" and newest[0]["outcome"] == "failed"
    assert newest[0]["lines"][0].startswith("NotFirstInLine: "), newest  # the skipped request is gone


async def test_an_action_whose_record_fails_is_done_and_says_so(
    nc: NatsClient, nats_url: str, subject_prefix: str, deployment: Subjects
) -> None:
    # The audit stream (the daemons made it) is full and refuses more (discard new): recording fails, the action
    # must not.
    js = nc.jetstream()
    full = audit_stream_config(deployment, storage=js_api.StorageType.MEMORY)
    full.max_msgs, full.discard = 1, js_api.DiscardPolicy.NEW
    await js.update_stream(full)
    await js.publish(deployment.audit("filler"), b"{}")
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    await store(nc, deployment, wk, cs)

    result = await rebaser(
        nats_url, subject_prefix, "change-set", "pause", str(wk), str(cs), "--no-wait", "--json"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["pause"]["cause"] == "operator"  # stdout: the answer alone
    assert "the audit entry is missing" in result.stderr and "the action is done" in result.stderr
    own, _ = await pause_of(nc, deployment, wk, cs)
    assert own is not None  # done all the same
    total, _ = await entries(nc, deployment)
    assert total == 1  # the filler only


async def test_a_writer_creates_the_audit_stream_the_daemons_did_not(
    nc: NatsClient, nats_url: str, subject_prefix: str, deployment: Subjects
) -> None:
    # Daemons older than the audit trail made no audit stream: the first action creates it, like the dead letters'.
    js = nc.jetstream()
    await js.delete_stream(deployment.audit_stream)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    await store(nc, deployment, wk, cs)
    result = await rebaser(nats_url, subject_prefix, "change-set", "pause", str(wk), str(cs), "--no-wait")
    assert result.exit_code == 0 and "audit entry is missing" not in result.output, result.output
    info = await js.stream_info(deployment.audit_stream)
    letters = await js.stream_info(deployment.dead_letter_stream)
    assert (info.config.storage, info.config.num_replicas) == (
        letters.config.storage,
        letters.config.num_replicas,
    )
    assert info.config.max_msgs == AUDIT_MAX_MSGS and info.state.messages == 1
