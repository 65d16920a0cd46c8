"""The repository refers only to documents it contains: no notes from outside it, and every ``docs/design.md §N``
reference names a section that exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# Spelled in pieces so this file does not match itself.
FOREIGN = ("design" + "-notes", "../" + "shared")
_DESIGN_REF = re.compile(r"docs/design\.md §(\d+)")


def tracked_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [ROOT / name for name in out.splitlines() if (ROOT / name).is_file()]


def test_no_references_to_documents_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}: {word}"
        for path in tracked_files()
        if path.suffix in {".py", ".md", ".toml", ".cfg", ".txt", ".yml", ".yaml", ""}
        for word in FOREIGN
        if word in path.read_text(errors="replace")
    ]
    assert found == []


def test_design_section_references_exist() -> None:
    sections = set(re.findall(r"^## (\d+)\. ", (ROOT / "docs" / "design.md").read_text(), re.MULTILINE))
    refs = {
        (str(path.relative_to(ROOT)), number)
        for path in tracked_files()
        if path.suffix in {".py", ".md"}
        for number in _DESIGN_REF.findall(path.read_text(errors="replace"))
    }
    assert refs, "the code refers to docs/design.md"
    assert {ref for ref in refs if ref[1] not in sections} == set()
