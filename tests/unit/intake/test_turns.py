"""The fair intake's turns (rebaser_server.intake.turns), as pure logic: the workspace waiting longest goes first,
whatever another has queued; a turn takes a weighted part of the free slots; a workspace at its share lets the
others go first, and one not eligible (over its part of the daemon) keeps its place without a turn."""

from __future__ import annotations

from rebaser_core.ids import WorkspacePk
from rebaser_server.intake.turns import WorkspaceTurns

A, B, C = WorkspacePk.new(), WorkspacePk.new(), WorkspacePk.new()


def _never(_: WorkspacePk) -> bool:
    return False


def test_the_workspace_waiting_longest_goes_first_and_one_with_tasks_left_goes_to_the_back() -> None:
    turns = WorkspaceTurns()
    assert turns.wait(A) and turns.wait(B)
    assert not turns.wait(A)  # a second task of A keeps A's place
    assert turns.next(_never) == A
    turns.wait(A)  # A has tasks left: behind B
    assert turns.waiting == [B, A]
    assert turns.next(_never) == B
    assert turns.next(_never) == A
    assert turns.next(_never) is None and len(turns) == 0


def test_a_workspace_alone_takes_every_free_slot_and_shares_them_by_weight_otherwise() -> None:
    turns = WorkspaceTurns(weights=[(str(A), 3)])
    turns.wait(A)
    assert turns.next(_never) == A
    assert turns.part(A, 100) == 100  # nobody else waits
    turns.wait(B)
    assert turns.part(A, 100) == 75  # A weighs 3, B 1
    turns.wait(C)
    assert turns.part(A, 10) == 10 * 3 // (3 + 2)
    assert turns.part(A, 1) == 1  # at least one task a turn
    assert turns.part(A, 0) == 0


def test_a_workspace_at_its_share_lets_the_others_go_first_but_alone_still_gets_its_turn() -> None:
    turns = WorkspaceTurns()
    turns.wait(A)
    turns.wait(B)
    assert turns.next(lambda wk: wk == A) == B
    assert turns.next(lambda wk: wk == A) == A  # nobody else: the slot is A's


def test_a_workspace_not_eligible_keeps_its_place_without_a_turn() -> None:
    turns = WorkspaceTurns()
    turns.wait(A)
    turns.wait(B)
    assert turns.next(_never, eligible=lambda wk: wk != A) == B
    assert turns.next(_never, eligible=lambda wk: wk != A) is None
    assert turns.waiting == [A]  # still first in line once it may take a slot again
    assert turns.next(_never) == A


def test_weights_count_while_waiting_and_leave_with_the_workspace() -> None:
    turns = WorkspaceTurns(weights=[(str(B), 4)])
    assert turns.weight(A) == 1 and turns.weight(B) == 4
    turns.wait(B)
    turns.wait(C)
    assert turns.part(A, 12) == 12 * 1 // (1 + 4 + 1)
    turns.forget(B)
    assert turns.part(A, 12) == 12 * 1 // (1 + 1)
    turns.forget(B)  # forgetting twice changes nothing
    assert turns.part(A, 12) == 6


def test_the_share_served_counts_tasks_taken_lately_halved_every_minute() -> None:
    from rebaser_core.settings import Settings
    from rebaser_server.intake.fairness import SERVED_HALF_LIFE, FairShare

    now = [100.0]
    fair = FairShare(None, Settings(), None)  # type: ignore[arg-type]  # nothing here reads NATS
    fair._clock = lambda: now[0]
    fair._halved_at = now[0]
    for _ in range(8):
        fair.taken(A)
    fair.taken(B)
    assert fair.served_lately() == {A: 8, B: 1}
    now[0] += SERVED_HALF_LIFE
    assert fair.served_lately() == {A: 4}  # B's one task is forgotten
    now[0] += 3 * SERVED_HALF_LIFE
    assert fair.served_lately() == {}


def test_a_workspace_found_with_work_while_checked_joins_the_front_of_the_line() -> None:
    turns = WorkspaceTurns()
    first, second, checked = WorkspacePk.new(), WorkspacePk.new(), WorkspacePk.new()
    turns.wait(first)
    turns.wait(second)
    assert turns.wait(checked, first=True)
    assert turns.waiting == [checked, first, second]
    assert not turns.wait(checked, first=True)  # already waiting: it keeps its place
    assert turns.next(lambda _: False) == checked
