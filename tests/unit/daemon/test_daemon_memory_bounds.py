"""What a daemon keeps per change set or per workspace outside the change sets it owns has a bound, driven past it
here (docs/capacity.md, "What a daemon keeps, and the bound of each"). The NATS side is not what is tested: where a
count would be read, a stand-in answers at once."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_server.app import ChangeSet
from rebaser_server.changeset import replies as replies_module
from rebaser_server.changeset.app_failures import AppFailureLog
from rebaser_server.changeset.context import Stats
from rebaser_server.changeset.replies import Replies
from rebaser_server.ops.observe import Observer
from rebaser_server.queries import backlog
from rebaser_server.queries.backlog import WorkspaceBacklogs
from rebaser_server.testing import fast_settings


def test_the_app_failure_log_tracks_a_bounded_number_of_change_sets() -> None:
    failures = AppFailureLog(period=60.0, tracked=3)
    change_sets = [ChangeSet(WorkspacePk.new(), ChangeSetId.new()) for _ in range(10)]
    for change_set in change_sets:
        assert failures.failed(change_set, "r", 1, 3, RuntimeError("app bug"))
    assert len(failures._last) == 3
    # The most recent are the ones kept: a second failure of the last one within the period is not logged again.
    assert not failures.failed(change_sets[-1], "r", 2, 3, RuntimeError("app bug"))
    assert failures.failed(change_sets[0], "r", 2, 3, RuntimeError("app bug"))  # forgotten: logged again


async def test_dead_letters_are_counted_for_a_bounded_number_of_workspaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replies_module, "_COUNTED_WORKSPACES", 5)
    settings = fast_settings(
        None
    )  # dead_letter_max_per_workspace 1,000: a purge every 10th letter of a workspace
    replies = Replies(Any, settings, settings.subjects, Stats(), Observer())  # type: ignore[arg-type]
    for _ in range(12):  # each a first letter: counted, no purge (nothing asked of NATS)
        target = settings.subjects.dead_letter(WorkspacePk.new(), ChangeSetId.new())
        await replies._keep_workspace_share(target)
        assert len(replies._letters_since_purge) <= 5


async def test_the_backlog_counts_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backlog, "_MAX_KEPT", 4)

    class Counting:
        async def stream_info(self, stream: str, subjects_filter: str) -> Any:
            return SimpleNamespace(state=SimpleNamespace(subjects={subjects_filter: 2}))

    placement = SimpleNamespace(layout=SimpleNamespace(shards=[0]))
    backlogs = WorkspaceBacklogs(Counting(), fast_settings(None), placement)  # type: ignore[arg-type]
    workspaces = [WorkspacePk.new() for _ in range(10)]
    for workspace in workspaces:
        assert await backlogs.queued(workspace) == 2
        assert len(backlogs._counted) <= 4
    assert list(backlogs._counted) == workspaces[-4:]  # the oldest counts went


def test_the_spans_remembered_with_tracing_on_are_bounded_and_the_oldest_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each request's span is kept for its reply, each DVU's cause for its run: a reply or a run that never comes
    # (a lost ownership, a crash of the group) must not leave them for ever.
    from nats.aio.msg import Msg
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from rebaser_core import headers as h
    from rebaser_server.ops import observe

    monkeypatch.setattr(observe, "_RECENT_REQUESTS", 5)
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observer = Observer(provider)
    change_sets = [ChangeSet(WorkspacePk.new(), ChangeSetId.new()) for _ in range(12)]
    ids = [f"request-{i}" for i in range(12)]
    for request_id, change_set in zip(ids, change_sets, strict=True):
        msg = Msg(_client=None, subject="rq", headers={h.NATS_MSG_ID: request_id})  # type: ignore[arg-type]
        with observer.request(msg, change_set, None):
            observer.dvu_due(change_set)
        assert len(observer._requests) <= 5 and len(observer._dvu_due) <= 5
    assert list(observer._requests) == ids[-5:] and list(observer._dvu_due) == change_sets[-5:]
    # The oldest request has no span left to answer under; the newest has.
    spans = len(exporter.get_finished_spans())
    with observer.reply({h.NATS_MSG_ID: ids[0]}, {}):
        pass
    assert len(exporter.get_finished_spans()) == spans
    with observer.reply({h.NATS_MSG_ID: ids[-1]}, reply := {}):
        pass
    assert "traceparent" in reply and len(exporter.get_finished_spans()) == spans + 1
    provider.shutdown()
