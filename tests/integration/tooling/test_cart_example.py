"""The guide's example app (examples/cart) runs as written: its tests pass in a fresh virtualenv outside the
repository, with every documented form of the pytest plugin (a class, a factory, a string, an app object, the
ini option). So do the tests of an app that the installed ``rebaser-server new-app`` writes, in the same
virtualenv (one install for both: it is most of the cost)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(630)  # a virtualenv and a package install: the subprocess's own 600 s bound rules
def test_the_cart_example_and_a_new_app_pass_in_a_fresh_virtualenv() -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "check_example.py"),
            "examples/cart",
            "--new-app",
            "stock-levels",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    runs = result.stdout.split("== ")[1:]
    assert [run.splitlines()[0] for run in runs] == ["cart", "stock-levels"], result.stdout[-4000:]
    assert all("7 passed" in run for run in runs), result.stdout[-4000:]
