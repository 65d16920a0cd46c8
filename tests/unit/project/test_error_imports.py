"""Every error class a guide names is importable from the one package that guide tells its reader to use: an app
author's errors from ``rebaser_server``, a client's from ``rebaser_client``. The example app uses that path too."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from rebaser_core import errors

ROOT = Path(__file__).resolve().parents[3]
ERROR_CLASSES = {
    name
    for name, value in vars(errors).items()
    if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__
}
# page -> the package its reader imports errors from (the page says so)
GUIDES = {"docs/apps.md": "rebaser_server", "docs/client.md": "rebaser_client"}


def named_errors(page: str) -> set[str]:
    """The error classes of the tree that ``page`` names in backticks, alone or called (``RefusedError(...)``)."""
    text = (ROOT / page).read_text()
    return {name for name in re.findall(r"`([A-Z][A-Za-z]+)[(`]", text) if name in ERROR_CLASSES}


@pytest.mark.parametrize("page", sorted(GUIDES))
def test_every_error_a_guide_names_is_importable_from_its_package(page: str) -> None:
    package = importlib.import_module(GUIDES[page])
    named = named_errors(page)
    assert named, f"{page} names no error class: the pattern above no longer finds them"
    missing = sorted(name for name in named if not hasattr(package, name))
    assert missing == [], f"{page} names {missing}, which {GUIDES[page]} does not export"
    assert f"from {GUIDES[page]} import" in (ROOT / page).read_text(), f"{page} never shows the import"


def test_the_example_app_imports_its_errors_from_rebaser_server() -> None:
    for path in sorted((ROOT / "examples" / "cart").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if alias.name in ERROR_CLASSES:
                        assert node.module == "rebaser_server", (
                            f"{path.name}: {alias.name} from {node.module}"
                        )
