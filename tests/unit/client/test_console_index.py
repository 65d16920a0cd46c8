"""The console's index of change sets (rebaser_client.admin.console.index): each row's states from what the
watches and reads said, the list's filters, finding by id, and the rows changed since the last push."""

from __future__ import annotations

from rebaser_client._record import RecordView
from rebaser_client.admin.console.index import STATES, Filter, Index
from rebaser_core.pauses import Pause

WK, OTHER = "01J0000000000000000000WK01", "01J0000000000000000000WK02"
CS1, CS2, CS3 = "01J00000000000000000000C01", "01J00000000000000000000C02", "01J00000000000000000000C03"


def _record(attempts: dict[str, int] | None = None, applied_seq: int = 0) -> RecordView:
    return RecordView(1, "d1", False, applied_seq, attempts or {}, None, False, (), 0, 4)


def test_states_follow_counts_pauses_and_records() -> None:
    index = Index()
    index.apply_counts(
        {(WK, CS1): {"queued": 3, "task": 1}, (WK, CS2): {"dead": 2}, (OTHER, CS3): {"queued": 1}}
    )
    row = index.rows[(WK, CS1)]
    assert index.states(row) == ("queued",)  # a task not yet known to be delivered: waiting
    index.set_task(row, "owned")
    assert index.states(row) == ("running",)
    index.apply_record(WK, CS1, _record({"01J0REQ": 2}))
    assert index.states(row) == ("running", "retrying") and row.owner == "d1" and row.last_event == 4
    index.apply_pause(
        WK, None, Pause("operator", "", 0.0)
    )  # the workspace's pause holds every change set of it
    assert index.states(row) == ("paused", "retrying")
    assert index.states(index.rows[(WK, CS2)]) == ("paused", "dead-lettered")
    assert index.states(index.rows[(OTHER, CS3)]) == ("queued",)
    # Every pause, as `rebaser status` lists them.
    assert [(p.workspace_id, p.change_set_id) for p in index.pauses()] == [(WK, None)]
    index.apply_pause(WK, None, None)
    index.apply_counts({})  # nothing queued, no task, no dead letter any more
    assert index.states(index.rows[(WK, CS2)]) == ()
    assert index.state_counts() == dict.fromkeys(STATES, 0) | {"retrying": 1}


def test_filters_and_changes() -> None:
    index = Index()
    index.apply_counts({(WK, CS1): {"queued": 1}, (WK, CS2): {"queued": 5}, (OTHER, CS3): {"dead": 1}})
    assert [r.change_set_id for r in index.matching(Filter(workspace_id=WK))] == [CS2, CS1]  # busiest first
    assert [r.change_set_id for r in index.matching(Filter(state="dead-lettered"))] == [CS3]
    assert Filter.parse({"workspace": f" {WK} ", "state": "bogus"}) == Filter(WK, None)
    assert Filter(WK, "queued").describe() == f"state queued, workspace {WK}"
    assert {r.key for r in index.take_changed()} == {(WK, CS1), (WK, CS2), (OTHER, CS3)}
    assert index.take_changed() == []  # each change is pushed once
    index.apply_pause(WK, CS1, Pause("operator", "", 0.0))
    assert [r.key for r in index.take_changed()] == [(WK, CS1)]
    # Its queue's first request moved on: its age is read again.
    row = index.rows[(WK, CS1)]
    index.set_oldest(row, 10.0)
    index.apply_record(WK, CS1, _record(applied_seq=7))
    assert row.oldest_at is None


def test_find_by_id_or_its_start() -> None:
    index = Index()
    index.apply_counts({(WK, CS1): {"queued": 1}, (OTHER, CS2): {"queued": 1}})
    assert [r.change_set_id for r in index.find(CS1)] == [CS1]
    assert {r.workspace_id for r in index.find(OTHER.lower())} == {OTHER}
    assert index.find("01J") == []  # too short to mean one
