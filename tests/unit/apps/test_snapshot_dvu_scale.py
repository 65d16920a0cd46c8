"""The dependent values update at hostile sizes: linear work, bounded error values. Pure model, no NATS."""

from __future__ import annotations

import time

import pytest

from rebaser_core.api import SetFunction, SetLiteral, Update
from rebaser_server.apps.snapshots.dvu import MAX_ERROR_CHARS, dependent_values_update
from rebaser_server.apps.snapshots.functions import BUILTIN_FUNCTIONS
from rebaser_server.apps.snapshots.model import Snapshot, rebase

CHAIN = 50_000


def chain(first: Update, length: int = CHAIN) -> Snapshot:
    updates: list[Update] = [first]
    updates += [
        SetFunction(path=f"/c{i}", function="identity", args=[f"/c{i - 1}"]) for i in range(1, length)
    ]
    rebased = rebase(Snapshot(), updates)
    assert rebased.ok
    return rebased.snapshot


def _cpu_seconds_for_chain(length: int) -> float:
    snapshot = chain(SetLiteral(path="/c0", value="v"), length)
    started = time.process_time()
    dependent_values_update(snapshot, BUILTIN_FUNCTIONS)
    return time.process_time() - started


# A quadratic update takes about 20 s for this chain, the linear one about a second. The timeouts are only
# backstops (generous: a loaded machine starves the test of CPU, wall time says little); linearity is asserted on
# CPU time, as the ratio between a chain and one ten times as long (about 10 when linear, about 100 when quadratic).
@pytest.mark.timeout(120)
def test_a_chain_of_50000_functions_is_computed_once_each_in_order() -> None:
    updated, order = dependent_values_update(chain(SetLiteral(path="/c0", value="v")), BUILTIN_FUNCTIONS)
    assert order == [f"/c{i}" for i in range(1, CHAIN)]
    assert updated.attributes[f"/c{CHAIN - 1}"].value == "v"
    assert not updated.errors() and not updated.roots


@pytest.mark.timeout(120)
def test_the_update_is_linear_in_the_chain_length() -> None:
    short, long = _cpu_seconds_for_chain(CHAIN // 10), _cpu_seconds_for_chain(CHAIN)
    assert long < 35 * max(short, 0.001), f"{CHAIN // 10}: {short:.3f}s CPU, {CHAIN}: {long:.3f}s CPU"


@pytest.mark.timeout(120)
def test_a_50000_long_cycle_becomes_error_values() -> None:
    snapshot = chain(SetFunction(path="/c0", function="identity", args=[f"/c{CHAIN - 1}"]))
    updated, order = dependent_values_update(snapshot, BUILTIN_FUNCTIONS)
    assert order == []
    errors = updated.errors()
    assert len(errors) == CHAIN and all("dependency cycle" in e for e in errors.values())


@pytest.mark.timeout(120)
def test_an_error_at_the_head_of_a_long_chain_stays_short_downstream() -> None:
    # Each error quotes its input's error: uncut, the messages would add up to gigabytes along this chain.
    snapshot = chain(SetFunction(path="/c0", function="no-such-function"))
    updated, _order = dependent_values_update(snapshot, BUILTIN_FUNCTIONS)
    errors = updated.errors()
    assert len(errors) == CHAIN
    assert max(len(e) for e in errors.values()) <= MAX_ERROR_CHARS
    assert (
        errors[f"/c{CHAIN - 1}"] == f"input /c{CHAIN - 2} has an error: unknown function 'no-such-function'"
    )


def test_a_function_error_quoting_a_huge_argument_is_cut() -> None:
    updates: list[Update] = [
        SetLiteral(path="/big", value="x" * 100_000),
        SetFunction(path="/n", function="sum", args=["/big"]),
    ]
    updated, _order = dependent_values_update(rebase(Snapshot(), updates).snapshot, BUILTIN_FUNCTIONS)
    error = updated.errors()["/n"]
    assert error.startswith("sum failed: TypeError") and len(error) <= MAX_ERROR_CHARS
