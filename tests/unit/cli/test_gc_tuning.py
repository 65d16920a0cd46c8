"""The daemon process's garbage-collector settings (``rebaser_server.cli.main.tune_gc``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from rebaser_core.settings import Settings
from rebaser_server.cli.main import tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_the_threshold_is_raised_and_start_up_is_frozen(restored_gc: None) -> None:
    _, older, oldest = gc.get_threshold()
    tune_gc(25_000)
    assert gc.get_threshold() == (25_000, older, oldest)
    assert gc.get_freeze_count() > 1_000  # the modules and schemas imported so far


def test_zero_leaves_the_collector_alone(restored_gc: None) -> None:
    before = gc.get_threshold()
    tune_gc(0)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_default_and_the_environment() -> None:
    assert Settings().gc_threshold == 100_000
    assert Settings.from_env({"REBASER_GC_THRESHOLD": "0"}).gc_threshold == 0


def test_a_threshold_python_cannot_take_is_refused_as_a_setting() -> None:
    with pytest.raises(ValidationError):
        Settings.from_env({"REBASER_GC_THRESHOLD": str(2**40)})  # gc.set_threshold would overflow at start-up
