"""``rebaser-server new-app NAME``: a working app and its tests in a new directory, from the template the apps
guide's example (``examples/cart``) is made from, so what a newcomer starts from is what the guide shows and the test
suite runs (``tests/unit/project/test_new_app.py`` checks that the example is this template's output)."""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from string import Template

import click

__all__ = ["CART_SUMMARY", "app_names", "command", "render", "write_app"]

TEMPLATE = Path(__file__).with_name("app_template")
# template file -> the file it becomes ({module} is the app's module name)
FILES = {
    "app.py.tmpl": "{module}.py",
    "test_app.py.tmpl": "test_{module}.py",
    "pytest.ini.tmpl": "pytest.ini",
}
CART_SUMMARY = (
    "A shopping cart on rebaser: the example of docs/apps.md. Copy this file, rename the class, and edit."
)
NEW_SUMMARY = (
    "{app}: made by rebaser-server new-app from the cart example of rebaser's apps guide. Edit it into yours."
)


def app_names(name: str) -> tuple[str, str]:
    """``ledger`` -> (``ledger``, ``LedgerApp``); ``stock-levels`` -> (``stock_levels``, ``StockLevelsApp``).

    Raises ``ValueError`` for a name that makes no Python module name."""
    module = name.strip().replace("-", "_").lower()
    if not re.fullmatch(r"[a-z][a-z0-9_]*", module) or keyword.iskeyword(module) or module.startswith("test"):
        raise ValueError(
            f"{name!r} makes no module name: use letters, digits, '-' and '_', starting with a letter "
            "(and not 'test...', which pytest would collect)"
        )
    return module, "".join(part.capitalize() for part in module.split("_") if part) + "App"


def render(module: str, app_class: str, summary: str) -> dict[str, str]:
    """The app's files: file name -> text."""
    names = {"module": module, "App": app_class, "summary": summary}
    return {
        target.format(module=module): Template((TEMPLATE / source).read_text()).substitute(names)
        for source, target in FILES.items()
    }


def write_app(name: str, directory: Path) -> list[Path]:
    """Write the app named ``name`` into ``directory`` (created; refused if it exists and is not empty)."""
    module, app_class = app_names(name)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise FileExistsError(f"{directory} exists and is not an empty directory: nothing written")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, text in render(module, app_class, NEW_SUMMARY.format(app=app_class)).items():
        path = directory / file_name
        path.write_text(text)
        written.append(path)
    return written


def _checkout_hint() -> str:
    """Where this rebaser was installed from, if from a checkout (an editable install: its pyproject.toml is two
    levels above this package); else a placeholder for the operator to fill in."""
    root = Path(__file__).resolve().parents[2]
    return str(root) if (root / "pyproject.toml").is_file() else "/path/to/rebaser"


@click.command("new-app")
@click.argument("name")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write it (default: ./NAME).",
)
def command(name: str, directory: Path | None) -> None:
    """Write a working app and its tests into a new directory, from the apps guide's example.

    NAME becomes the module (ledger.py) and the class (LedgerApp). Then, in that directory:
    pip install -e '/path/to/rebaser[testing]' (rebaser is on no package index: from its checkout, or a wheel
    built there, docs/apps.md) and pytest; rebaser-server --app NAME:NAMEApp serves it.
    """
    target = directory if directory is not None else Path(name)
    try:
        written = write_app(name, target)
    except (ValueError, FileExistsError) as err:
        raise click.ClickException(str(err)) from None
    module, app_class = app_names(name)
    click.echo(f"wrote {', '.join(path.name for path in written)} in {target}")
    click.echo(
        f"  cd {target} && pip install -e '{_checkout_hint()}[testing]' && pytest    # its tests, on a real daemon"
    )
    click.echo(
        "    (rebaser is on no package index: install it from its checkout as above, or from a wheel built there"
        " with `pip wheel --no-deps -w dist .`: docs/apps.md#testing-it)"
    )
    click.echo(
        f"  PYTHONPATH={target} rebaser-server --app {module}:{app_class}    # a daemon that serves it"
    )
