"""Garbage written over what the daemons store and read back (a bug, or anyone with write access to the buckets),
against a real nats-server: an unreadable change-set record quarantines its change set (paused, not retried for ever,
named with its repair, repaired by ``rebaser change-set reset-record``); an unreadable pause entry still pauses, across
a daemon restart; an unreadable layout entry keeps a starting daemon waiting, saying why on ``/readyz``, until
``rebaser streams repair`` rewrites it."""

from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner, Result
from nats.aio.client import Client as NatsClient
from nats.js.kv import KeyValue

from rebaser_client import RebaserClient
from rebaser_client._pause_read import all_pauses
from rebaser_client._pausing import resume_change_set
from rebaser_client.admin.change_set import change_set_report
from rebaser_client.admin.cli.main import main as cli
from rebaser_client.admin.console.index import Index
from rebaser_client.admin.console.pages import overview_body
from rebaser_client.admin.console.pages_detail import change_set_detail
from rebaser_client.admin.format import status_json
from rebaser_client.admin.status import status_report
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.layout_store import open_layout, read_layout
from rebaser_core.nats.pause_store import open_pauses
from rebaser_core.pauses import Pause, change_set_key
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.ops.status import status_of
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp

GARBAGE = b"\xff\x00 not what a daemon wrote {"


async def rebaser(nats_url: str, prefix: str, *args: str) -> Result:
    """``rebaser ARGS --nats-url … --prefix …`` in a thread (the command runs its own event loop)."""
    argv = [*args, "--nats-url", nats_url, "--prefix", prefix]
    return await asyncio.to_thread(CliRunner().invoke, cli, argv, catch_exceptions=False)


async def _applied(daemon: Daemon, cs: ChangeSet) -> list[str]:
    record = await daemon.store.read(cs)
    return [] if record is None else list(record.state["applied"])


async def _pauses(nc: NatsClient, settings: Settings) -> KeyValue:
    kv = await open_pauses(nc.jetstream(), settings.subjects, create=True, storage=settings.storage)
    assert kv is not None
    return kv


async def test_an_unreadable_record_is_quarantined_named_with_its_repair_and_repaired(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, nats_url: str
) -> None:
    settings = fast_settings(subject_prefix)
    wk, cs_id, other = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
    cs = ChangeSet(wk, cs_id)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        assert (await client.enqueue_updates_with_reply(wk, cs_id, [], timeout=20)).ok
        await wait_for(lambda: cs not in daemon.owned, timeout=20, message="released after going quiet")
        records = await nc.jetstream().key_value(settings.subjects.change_sets_bucket)
        await records.put(f"{wk}.{cs_id}", GARBAGE)

        # A request for it: the daemon finds the record unreadable once, and quarantines the change set.
        waiting = asyncio.create_task(client.enqueue_updates_with_reply(wk, cs_id, [], timeout=90))
        await wait_for(
            lambda: daemon.stats.records_unreadable == 1 and daemon.stats.tasks_paused == 1,
            timeout=20,
            message="quarantined: paused, its task let go",
        )
        entry = await (await _pauses(nc, settings)).get(change_set_key(wk, cs_id))
        assert Pause.decode(entry.value or b"").cause == "record_unreadable"
        # Not retried: a new task for it is let go untouched, the record not read again.
        behind = await client.enqueue_updates(wk, cs_id, [])
        await wait_for(lambda: daemon.stats.tasks_paused >= 2, timeout=20, message="the next task let go")
        assert daemon.stats.records_unreadable == 1 and daemon.stats.tasks_retried == 0
        assert not waiting.done()  # kept queued, not answered: nothing can say what was applied
        # Other change sets are served as usual.
        assert (await client.enqueue_updates_with_reply(wk, other, [], timeout=20)).ok

        # Named with its repair: `rebaser status` (its JSON and the table), the web console, the daemon's /status.
        repair = f"rebaser change-set reset-record {wk} {cs_id}"
        report = await status_report(nc, settings.subjects)
        (line,) = [p for p in status_json(report)["pauses"] if p["change_set_id"] == str(cs_id)]
        assert line["cause"] == "record_unreadable" and line["repair"] == repair and line["queued"] == 2
        table = await rebaser(nats_url, subject_prefix, "status")
        assert table.exit_code == 0 and repair in table.output, table.output
        assert repair in overview_body(report, None, Index(), None)
        shown = await rebaser(nats_url, subject_prefix, "change-set", "show", str(wk), str(cs_id))
        assert shown.exit_code == 0 and repair in shown.output, shown.output
        detail = await change_set_report(nc, settings.subjects, wk, cs_id)
        assert repair in change_set_detail(str(wk), str(cs_id), detail, None, ("paused",), read_only=True)
        held = (await status_of(daemon))["paused"]["held"]
        assert [h["repair"] for h in held if h["cause"] == "record_unreadable"] == [repair]

        # The repair: the record deleted, the quarantine lifted, the queue applied from the initial state.
        fixed = await rebaser(
            nats_url, subject_prefix, "change-set", "reset-record", str(wk), str(cs_id), "--yes"
        )
        assert fixed.exit_code == 0 and "resumed" in fixed.output, fixed.output
        reply = await asyncio.wait_for(waiting, 60)
        assert reply.ok
        await client.wait_settled(wk, cs_id, timeout=30)
        assert await _applied(daemon, cs) == [str(reply.id), str(behind)]
        assert daemon.stats.records_unreadable == 1
        # Refused on a record that reads: nothing to repair.
        again = await rebaser(
            nats_url, subject_prefix, "change-set", "reset-record", str(wk), str(cs_id), "--yes"
        )
        assert again.exit_code != 0 and "nothing to repair" in again.output


async def test_an_unreadable_pause_entry_still_pauses_after_a_restart(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
    cs = ChangeSet(wk, cs_id)
    repair = f"rebaser change-set resume {wk} {cs_id}"
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        first = await client.enqueue_updates_with_reply(wk, cs_id, [], timeout=20)
        kv = await _pauses(nc, settings)
        await kv.put(change_set_key(wk, cs_id), Pause.now("operator", "before the garbage").encode())
        await wait_for(lambda: cs not in daemon.owned, timeout=20, message="let go once paused")
        await kv.put(change_set_key(wk, cs_id), GARBAGE)
        await wait_for(
            lambda: daemon.pauses.unreadable == 1,
            timeout=20,
            message="the garbage seen as an unreadable pause",
        )
        held = await client.enqueue_updates(wk, cs_id, [])
    # A new daemon reads the bucket at start-up: the garbage still pauses the change set (fail closed).
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        assert daemon.pauses.unreadable == 1
        later = await client.enqueue_updates(wk, cs_id, [])  # a new task for the change set
        await wait_for(
            lambda: daemon.stats.tasks_paused >= 1, timeout=20, message="its task let go, untouched"
        )
        assert await _applied(daemon, cs) == [str(first.id)]
        status = await status_of(daemon)
        (entry,) = status["paused"]["held"]
        assert (
            entry["cause"] == "unreadable"
            and entry["repair"] == repair
            and status["paused"]["unreadable"] == 1
        )
        listed, _ = await all_pauses(nc.jetstream(), settings.subjects)
        assert [p.pause.cause for p in listed] == ["unreadable"]
        # The repair named: the resume deletes the entry, and the queue is applied in order.
        result = await resume_change_set(nc, settings.subjects, wk, cs_id)
        assert result.was is not None and result.was.cause == "unreadable"
        await client.wait_settled(wk, cs_id, timeout=30)
        assert await _applied(daemon, cs) == [str(first.id), str(held), str(later)]


async def test_an_unreadable_layout_keeps_a_daemon_waiting_and_saying_why_until_repaired(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, nats_url: str
) -> None:
    settings = fast_settings(subject_prefix)
    wk, cs_id = WorkspacePk.new(), ChangeSetId.new()
    async with running_daemon(nc, settings, RecordingApp()):
        assert (await client.enqueue_updates_with_reply(wk, cs_id, [], timeout=20)).ok
    kv = await open_layout(nc.jetstream(), settings.subjects)
    assert kv is not None
    found = await read_layout(kv, settings.subjects)
    assert found is not None
    before = found[0]
    for _ in range(5):  # every revision the bucket keeps is garbage: the repair works from the streams
        await kv.put(settings.subjects.layout_key, GARBAGE)

    daemon = Daemon(nc, settings, RecordingApp())
    start = asyncio.create_task(daemon.start())
    try:
        await wait_for(lambda: "layout" in daemon.health.problems, timeout=20, message="the problem noted")
        status = await status_of(daemon)
        assert not status["ready"] and not start.done()
        assert any("unreadable" in r and "rebaser streams repair" in r for r in status["not_ready"]), status

        fixed = await rebaser(nats_url, subject_prefix, "streams", "repair", "--json")
        assert fixed.exit_code == 0, fixed.output
        answer = json.loads(fixed.output)
        assert answer["source"] == "streams"
        assert {k: answer["layout"][k] for k in ("streams", "mode", "intake")} == {
            "streams": before.streams,
            "mode": before.mode,
            "intake": before.intake,
        }
        await asyncio.wait_for(start, 30)  # started once the entry reads again
        assert daemon.serving and not daemon.health.problems
        assert "layout" not in (await status_of(daemon))["problems"]
        assert (await client.enqueue_updates_with_reply(wk, cs_id, [], timeout=20)).ok
        again = await rebaser(nats_url, subject_prefix, "streams", "repair")
        assert again.exit_code != 0 and "nothing to repair" in again.output
        # Both are in the audit trail, the repair and the refusal.
        audit = json.loads((await rebaser(nats_url, subject_prefix, "audit", "--json")).output)
        assert [(e["what"], e["outcome"]) for e in audit["entries"]] == [
            ("streams-repair", "failed"),
            ("streams-repair", "ok"),
        ]
        assert audit["entries"][1]["lines"][0].startswith("rewritten from streams"), audit
    finally:
        start.cancel()
        await asyncio.wait({start}, timeout=10)
        await asyncio.wait_for(daemon.shutdown(), 45)
