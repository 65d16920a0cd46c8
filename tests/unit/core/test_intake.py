"""A layout's intake (fifo or fair): kept in the layout's KV value, read as fifo from a value written before there
was a choice, and a flag that disagrees with it is refused; workspace weights from the environment."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from rebaser_core.errors import LayoutMismatch
from rebaser_core.layout import Layout
from rebaser_core.settings import Settings


def test_the_intake_survives_the_kv_value_and_an_older_value_reads_as_fifo() -> None:
    layout = Layout(streams=3, intake="fair")
    assert Layout.decode(layout.encode()) == layout
    older = json.dumps({"streams": 2, "mode": "shared", "previous": None, "epoch": 4}).encode()
    assert Layout.decode(older).intake == "fifo"
    assert layout.changed_to(4).intake == "fair"  # a reshard keeps it


def test_a_flag_that_disagrees_with_the_layouts_intake_is_refused() -> None:
    Layout(intake="fair").check_flags(None, None, "this daemon", "fair")
    Layout(intake="fair").check_flags(None, None, "this daemon", None)
    with pytest.raises(LayoutMismatch, match="--intake fifo"):
        Layout(intake="fair").check_flags(None, None, "this daemon", "fifo")
    with pytest.raises(ValueError, match="intake"):
        Layout(intake="lifo")  # type: ignore[arg-type]


def test_workspace_weights_from_the_environment_and_a_config_table() -> None:
    settings = Settings.from_env({"REBASER_WORKSPACE_WEIGHTS": "01abc=4, 01def=2"})
    assert settings.workspace_weights == (("01ABC", 4), ("01DEF", 2))
    assert Settings(workspace_weights={"x": 3}).workspace_weights == (("X", 3),)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="whole number"):
        Settings.from_env({"REBASER_WORKSPACE_WEIGHTS": "01abc=lots"})
    with pytest.raises(ValidationError, match="between 1 and 1000"):
        Settings.from_env({"REBASER_WORKSPACE_WEIGHTS": "01abc=0"})
