"""``rebaser watch`` on a terminal: each change set's state from its events alone, kept up to date under the lines."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from rebaser_client.admin.cli.watch import _Display
from rebaser_client.admin.cli.watch_state import WatchState
from rebaser_core.api import ChangeSetEvent
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk

WK, CS = WorkspacePk.new(), ChangeSetId.new()


def _event(kind: str, seq: int, **fields: Any) -> ChangeSetEvent:
    durable = kind in ("applied", "dvu_finished")
    return ChangeSetEvent(
        id=RequestId.new(),
        workspace_id=WK,
        change_set_id=CS,
        kind=kind,  # type: ignore[arg-type]
        seq=seq,
        durable=durable,
        at=0.0,
        epoch=3,
        **fields,
    )


def _story() -> list[ChangeSetEvent]:
    return [
        _event("taken", 0, owner="d1"),
        _event("applied", 1, request_id=RequestId.new(), status="success", queued=2),
        _event("applied", 2, request_id=RequestId.new(), status="success", queued=0),
        _event("dvu_started", 2, owner="d1"),
        _event("dvu_finished", 3, duration_s=0.01, settled=True),
        _event("released", 3, owner="d1", reason="released"),
    ]


def test_the_state_follows_the_events() -> None:
    state = WatchState()
    seen = []
    for event in _story():
        state.update(event)
        seen.append(state.lines(workspace=False)[0])
    assert seen[0] == "owned by d1 (epoch 3), last #0, queued ?, busy"
    assert seen[1] == "owned by d1 (epoch 3), last #1, queued 2, busy"
    assert seen[3] == "owned by d1 (epoch 3), last #2, queued 0, busy, DVU running"
    assert seen[4] == "owned by d1 (epoch 3), last #3, queued 0, settled"
    assert seen[5] == "not owned, last #3, queued 0, settled"
    assert state.lines(workspace=True) == [f"{CS} not owned, last #3, queued 0, settled"]


def test_a_workspace_shows_the_change_sets_heard_from_last() -> None:
    state = WatchState()
    others = [ChangeSetId.new() for _ in range(20)]
    for cs in others:
        state.update(_event("taken", 0, owner="d1").model_copy(update={"change_set_id": cs}))
    shown = state.lines(workspace=True)
    assert len(shown) == 12 and shown[-1].startswith(str(others[-1]))


def test_on_a_terminal_the_state_is_drawn_under_the_lines() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with _Display(True, False, console=console) as show:
        for event in _story():
            show(event)
    text = out.getvalue()
    assert "applied" in text and "released" in text  # the lines
    assert "owned by d1 (epoch 3), last #2, queued 0, busy, DVU running" in text  # the state, drawn in place


def test_following_the_record_feed_the_state_says_the_epoch_not_an_owner() -> None:
    from rebaser_core.api import ChangeSetEvent
    from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk

    state = WatchState(notices=False)
    state.update(
        ChangeSetEvent(
            id=RequestId.new(),
            workspace_id=WorkspacePk.new(),
            change_set_id=ChangeSetId.new(),
            kind="applied",
            seq=7,
            durable=True,
            at=0,
            epoch=3,
            queued=2,
        )
    )
    assert state.lines(workspace=False) == ["epoch 3, last #7, queued 2, busy"]
