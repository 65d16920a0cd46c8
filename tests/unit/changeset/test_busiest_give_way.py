"""Who gives way under pressure (rebaser_server.changeset.quiet.GiveWay): the busiest workspaces first, then, should
that free nothing for BUSIEST_FIRST seconds, any workspace. Pure logic, no NATS."""

from __future__ import annotations

from rebaser_core.ids import WorkspacePk
from rebaser_server.changeset.quiet import BUSIEST_FIRST, GiveWay, busiest

A, B, C = WorkspacePk.new(), WorkspacePk.new(), WorkspacePk.new()


def test_the_busiest_are_those_owning_at_least_an_even_part() -> None:
    assert busiest({A: 3, B: 1}) == {A}
    assert busiest({A: 5, B: 4, C: 1}) == {A, B}
    assert busiest({A: 2, B: 2}) == {A, B}  # all alike: all of them
    assert busiest({A: 1}) == {A}
    assert busiest({}) == frozenset()


def test_without_pressure_nobody_gives_way() -> None:
    give_way = GiveWay()
    assert not give_way.pressure and not give_way.covers(A)


def test_under_pressure_the_busiest_give_way_first_then_anyone() -> None:
    give_way = GiveWay()
    give_way.press({A: 3, B: 1}, now=100.0)
    assert give_way.pressure
    assert give_way.covers(A) and not give_way.covers(B)
    # Still within BUSIEST_FIRST: the busiest as they are now.
    give_way.press({A: 1, B: 3}, now=100.0 + BUSIEST_FIRST / 2)
    assert give_way.covers(B) and not give_way.covers(A)
    # Nothing freed for BUSIEST_FIRST: any idle change set gives way.
    give_way.press({A: 1, B: 3}, now=100.0 + BUSIEST_FIRST)
    assert give_way.covers(A) and give_way.covers(B) and give_way.covers(C)


def test_a_freed_slot_starts_over_with_the_busiest() -> None:
    give_way = GiveWay()
    give_way.press({A: 3, B: 1}, now=0.0)
    give_way.press({A: 3, B: 1}, now=BUSIEST_FIRST + 1)
    assert give_way.covers(B)
    give_way.ease()
    assert not give_way.pressure and not give_way.covers(A)
    give_way.press({A: 3, B: 1}, now=BUSIEST_FIRST + 2)
    assert give_way.covers(A) and not give_way.covers(B)
