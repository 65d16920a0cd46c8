"""The guide's example app (examples/cart) runs as written, with every documented form of the pytest plugin (a class,
a factory, a string, an app object, the ini option). So do the tests of an app that ``rebaser-server new-app``
writes.

Twice: here, with the project's own virtualenv (make test), and in a fresh virtualenv outside the repository with
rebaser installed there as a user installs it (``packaging``: make check-examples, a step of its own in CI; one
install for both apps, and it is most of the cost)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _passed(stdout: str, runs: int = 2) -> None:
    assert stdout.count("7 passed") == runs, stdout[-4000:]


def test_the_cart_example_and_a_new_app_pass(tmp_path: Path) -> None:
    cart, new = tmp_path / "cart", tmp_path / "stock-levels"
    shutil.copytree(
        ROOT / "examples" / "cart", cart, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache")
    )
    made = [sys.executable, "-m", "rebaser_server", "new-app", "stock-levels", "--dir", str(new)]
    subprocess.run(made, check=True, capture_output=True, timeout=120)
    out = ""
    for project in (cart, new):
        run = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-p",
            "no:randomly",
        ]
        done = subprocess.run(run, cwd=project, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{project.name}: {done.stdout[-4000:]}{done.stderr[-4000:]}"
        out += done.stdout
    _passed(out)


@pytest.mark.packaging
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
