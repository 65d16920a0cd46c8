"""``rebaser-server new-app``: the guide's example is this template's output, byte for byte, so a new app starts
from what the guide shows and the suite runs (tests/integration/tooling/test_cart_example.py runs a new app's
tests in a fresh virtualenv)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rebaser_server.cli import main as server_cli
from rebaser_server.devtools.new_app import CART_SUMMARY, app_names, render, write_app

ROOT = Path(__file__).resolve().parents[3]


def test_the_cart_example_is_the_template_s_output() -> None:
    rendered = render("cart", "CartApp", CART_SUMMARY)
    assert sorted(rendered) == ["cart.py", "pytest.ini", "test_cart.py"]
    for name, text in rendered.items():
        assert text == (ROOT / "examples" / "cart" / name).read_text(), (
            f"examples/cart/{name} left the template"
        )


@pytest.mark.parametrize(
    ("name", "names"),
    [("ledger", ("ledger", "LedgerApp")), ("stock-levels", ("stock_levels", "StockLevelsApp"))],
)
def test_a_name_makes_the_module_and_the_class(name: str, names: tuple[str, str]) -> None:
    assert app_names(name) == names


@pytest.mark.parametrize("name", ["2fast", "class", "my app", "test_things", ""])
def test_a_name_that_makes_no_module_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="makes no module name"):
        app_names(name)


def test_it_writes_an_app_its_tests_and_the_plugin_s_ini_and_compiles(tmp_path: Path) -> None:
    written = write_app("ledger", tmp_path / "ledger")
    assert sorted(p.name for p in written) == ["ledger.py", "pytest.ini", "test_ledger.py"]
    app = (tmp_path / "ledger" / "ledger.py").read_text()
    assert "class LedgerApp(App):" in app and "cart:CartApp" not in app
    assert "rebaser_app = ledger:LedgerApp" in (tmp_path / "ledger" / "pytest.ini").read_text()
    tests = (tmp_path / "ledger" / "test_ledger.py").read_text()
    assert "from ledger import LedgerApp" in tests and "CartApp" not in tests
    for path in written:
        if path.suffix == ".py":
            compile(path.read_text(), str(path), "exec")


def test_the_command_refuses_a_directory_with_files_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "ledger").mkdir()
    (tmp_path / "ledger" / "keep.txt").write_text("mine")
    result = CliRunner().invoke(server_cli.main, ["new-app", "ledger", "--dir", str(tmp_path / "ledger")])
    assert result.exit_code == 1 and "exists and is not an empty directory: nothing written" in result.output
    assert sorted(p.name for p in (tmp_path / "ledger").iterdir()) == ["keep.txt"]
    bad = CliRunner().invoke(server_cli.main, ["new-app", "my app", "--dir", str(tmp_path / "x")])
    assert bad.exit_code == 1 and "makes no module name" in bad.output and "Traceback" not in bad.output


def test_the_command_says_what_to_run_next(tmp_path: Path) -> None:
    result = CliRunner().invoke(server_cli.main, ["new-app", "ledger", "--dir", str(tmp_path / "ledger")])
    assert result.exit_code == 0, result.output
    assert "--app ledger:LedgerApp" in result.output
    # rebaser is on no package index: the command names this checkout (the tests run from one), and a wheel.
    root = Path(__file__).resolve().parents[3]
    assert f"pip install -e '{root}[testing]' && pytest" in result.output, result.output
    assert "pip install 'rebaser[testing]'" not in result.output
    assert "no package index" in result.output and "pip wheel --no-deps -w dist ." in result.output
