"""The code blocks of the README and of every page under docs/: each is run, checked or shown, as ``INVENTORY``
lists, so a new page or block cannot go untested unnoticed.

- **run**, against a daemon of its own (the default app, an embedded nats-server on a free port), found through
  ``REBASER_NATS_URL``: every ```python block of the README, and every ```python or ```sh block marked
  ``runnable``, by a ``<!-- runnable -->`` line right before the fence (the docs site hides it) or in the info string
  (```` ```sh runnable ````, as the README does). They are run as a user would paste them: Python as a file with the
  project's interpreter, shell through ``bash -eu -o pipefail`` in a directory whose ``.venv/bin`` is this
  interpreter's, so ``.venv/bin/rebaser`` resolves.
- **copy**: a block after a ``<!-- same-as: PATH -->`` line is that file of the repository, in full (a file that
  its own tests run).
- **checked**: every other ```python block is compiled and its imports of rebaser's packages must resolve; every
  other ```sh block passes ``bash -n``; ```json, ```yaml and ```toml blocks parse, and a ```toml block (a
  ``rebaser-server --config`` file) loads as one.
- **drawn**: ```mermaid blocks; the docs site draws them (test_docs_site.py checks that).
- **shown**: output, plain text, ```console without a marker.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# Every page: the README and everything under docs/ (the site's pages and the history).
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))

# Per page, in page order, each block as "kind:what the suite does with it" (see the module's docstring). A page or
# block added, removed or re-marked fails test_every_block_is_accounted_for until it is listed here: decide then
# whether it should run.
INVENTORY: dict[str, list[str]] = {
    "README.md": ["sh:checked", "python:run", "python:run", "sh:run"],
    "docs/BENCHMARKS.md": [
        "plain:shown",
        "sh:checked",
        "sh:checked",
        "sh:checked",
        "sh:checked",
        "sh:checked",
        "sh:checked",
        "sh:checked",
    ],
    "docs/RELIABILITY.md": ["plain:shown"],
    "docs/capacity.md": ["sh:checked", "sh:checked"],
    "docs/accounts.md": [],
    "docs/apps.md": ["sh:checked", "text:shown", "python:copy", "sh:checked", "sh:checked", "python:copy"],
    "docs/client.md": ["python:run", "sh:run"],
    "docs/console.md": [
        "sh:checked",
        "json:checked",
        "sh:checked",
        "nginx:shown",
        "sh:checked",
        "sh:checked",
    ],
    "docs/contributing.md": [],
    "docs/deployment.md": [
        "sh:checked",
        "sh:checked",
        "sh:checked",
        "sh:checked",
        "sh:checked",
        "sh:checked",
        "sh:checked",
    ],
    "docs/design.md": ["plain:shown", "mermaid:drawn", "mermaid:drawn"],
    "docs/events.md": ["python:checked", "python:checked", "sh:checked", "plain:shown"],
    "docs/fair-share.md": [
        "sh:checked",
        "sh:checked",
        "sh:checked",
        "sh:checked",
        "sh:checked",
        "sh:checked",
    ],
    "docs/history/benchmarks.md": [],
    "docs/history/operations.md": [],
    "docs/history/memory.md": [],
    "docs/history/reliability.md": [],
    "docs/index.md": ["sh:checked"],
    "docs/observability.md": ["plain:shown"],
    "docs/operations.md": ["sh:run", "mermaid:drawn", "plain:shown"],
    "docs/pausing.md": ["sh:checked"],
    "docs/power-loss.md": [],
    "docs/protocol.md": [
        "plain:shown",
        "plain:shown",
        "plain:shown",
        "json:checked",
        "json:checked",
        "json:checked",
        "plain:shown",
        "json:checked",
        "plain:shown",
        "json:checked",
        "json:checked",
        "json:checked",
        "json:checked",
        "json:checked",
        "json:checked",
        "json:checked",
        "json:checked",
        "sh:checked",
        "plain:shown",
        "json:checked",
    ],
    "docs/running.md": ["sh:checked", "toml:checked"],
    "docs/snapshot-app.md": [],
}

# A fence opens with three or more backticks or tildes (indented in a list item, or not) and an info string, and
# closes with at least as many of the same character.
_OPEN = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_SAME_AS = re.compile(r"^<!-- same-as: (\S+) -->$")
_SHELLS = ("sh", "bash", "shell")
_LISTENING = re.compile(rb"embedded nats-server listening on (nats://\S+)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    kind: str  # the info string's first word, "plain" without one
    action: str  # run, copy, checked, drawn or shown
    code: str
    same_as: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}-{self.kind}"


def page_blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, in order."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _OPEN.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        closing = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = i + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        body = "".join(
            line[min(indent, len(line) - len(line.lstrip(" "))) :] + "\n" for line in lines[i + 1 : end]
        )
        words = opening["info"].split()
        marker = lines[i - 1].strip() if i else ""
        blocks.append(_classify(page, i + 1, words, marker, body))
        i = end + 1
    return blocks


def _classify(page: Path, line: int, words: list[str], marker: str, body: str) -> Block:
    kind = words[0].lower() if words else "plain"
    runnable = marker == "<!-- runnable -->" or "runnable" in words[1:]
    same_as = _SAME_AS.match(marker)
    if same_as is not None:
        action = "copy"
    elif kind == "python":
        action = "run" if runnable or page.name == "README.md" else "checked"
    elif kind in (*_SHELLS, "console"):
        action = "run" if runnable else "checked" if kind in _SHELLS else "shown"
    elif kind in ("json", "toml", "yaml", "yml"):
        action = "checked"
    elif kind == "mermaid":
        action = "drawn"
    else:
        action = "shown"
    return Block(page, line, kind, action, body, same_as[1] if same_as else None)


ALL_BLOCKS = [block for page in PAGES for block in page_blocks(page)]


def blocks_doing(*actions: str) -> list[pytest.ParameterSet]:
    return [pytest.param(block, id=block.id) for block in ALL_BLOCKS if block.action in actions]


def test_every_block_is_accounted_for() -> None:
    found = {
        str(page.relative_to(ROOT)): [f"{block.kind}:{block.action}" for block in page_blocks(page)]
        for page in PAGES
    }
    changed = "\n".join(
        f"  {page}: listed {INVENTORY.get(page)}, found {found.get(page)}"
        for page in sorted(found.keys() | INVENTORY.keys())
        if found.get(page) != INVENTORY.get(page)
    )
    assert found == INVENTORY, (
        f"the blocks of these pages changed:\n{changed}\nif that is meant, and each block is run where it can "
        "be, list them in INVENTORY"
    )


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "docs" / "client.md"], ids=["README", "client"])
def test_the_page_has_runnable_blocks(page: Path) -> None:
    kinds = [block.kind for block in page_blocks(page) if block.action == "run"]
    assert "python" in kinds and "sh" in kinds, kinds


@pytest.mark.parametrize("block", blocks_doing("copy"))
def test_copied_block_is_the_file(block: Block) -> None:
    assert block.same_as is not None
    assert block.code == (ROOT / block.same_as).read_text(), f"{block.id} differs from {block.same_as}"


@pytest.mark.parametrize("block", blocks_doing("checked"))
def test_block_is_checked(block: Block, tmp_path: Path) -> None:
    if block.kind == "python":
        _check_python(block)
    elif block.kind in _SHELLS:
        checked = subprocess.run(
            ["bash", "-n", "-c", block.code], capture_output=True, text=True, timeout=30, check=False
        )
        assert checked.returncode == 0, f"{block.id}: bash -n:\n{checked.stderr}"
    elif block.kind == "json":
        json.loads(block.code)
    elif block.kind in ("yaml", "yml"):
        yaml = importlib.import_module("yaml")  # PyYAML, which mkdocs brings
        yaml.safe_load(block.code)
    elif block.kind == "toml":
        tomllib.loads(block.code)
        _check_config_file(block, tmp_path)
    else:
        raise AssertionError(f"{block.id}: no check for {block.kind}")


def _check_python(block: Block) -> None:
    """Compiles, and every name it imports from rebaser's packages exists."""
    tree = ast.parse(block.code, filename=block.id)
    compile(tree, block.id, "exec")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0].startswith("rebaser_"):
                    importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0].startswith("rebaser_"):
            assert node.module is not None
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")  # a submodule
                    except ImportError:
                        raise AssertionError(f"{block.id}: {node.module} has no {alias.name}") from None


def _check_config_file(block: Block, tmp_path: Path) -> None:
    """The block, as ``rebaser-server --config FILE``: every key known and every value accepted."""
    from rebaser_server.cli.config_file import FILE_SETTINGS, settings_from
    from rebaser_server.cli.main import main

    config = tmp_path / "rebaser.toml"
    config.write_text(block.code)
    with main.make_context("rebaser-server", ["--config", str(config)]) as ctx:
        settings_from(ctx.meta.get(FILE_SETTINGS, {}), config_path=config)


@pytest.fixture
async def readme_daemon(tmp_path: Path) -> AsyncIterator[str]:
    """``rebaser-server`` as ``make serve`` runs it, but on a free port and a store in ``tmp_path``; its URL."""
    log = tmp_path / "daemon.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REBASER_NATS_URL", None)  # would make it a client of another server instead of embedding its own
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rebaser_server",
            "--data-dir",
            str(tmp_path / "data"),
            "--port",
            "0",
            "--http-port",
            "-1",
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            cwd=str(tmp_path),
        )
    try:
        deadline = asyncio.get_running_loop().time() + 30
        while b"rebaser daemon serving" not in log.read_bytes():
            if proc.returncode is not None or asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"daemon did not start:\n{log.read_text()}")
            await asyncio.sleep(0.05)
        found = _LISTENING.search(log.read_bytes())
        assert found is not None, log.read_text()
        yield found[1].decode()
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@pytest.mark.parametrize("block", blocks_doing("run"))
async def test_readme_block_runs(readme_daemon: str, tmp_path: Path, block: Block) -> None:
    workdir = tmp_path / "paste"
    (workdir / ".venv").mkdir(parents=True)
    (workdir / ".venv" / "bin").symlink_to(Path(sys.executable).parent)
    env = {**os.environ, "REBASER_NATS_URL": readme_daemon, "PYTHONPATH": str(ROOT)}
    env.pop("REBASER_PREFIX", None)
    if block.kind == "python":
        script = workdir / "example.py"
        script.write_text(block.code)
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-eu", "-o", "pipefail", "-c", block.code]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        cwd=str(workdir),
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, (
        f"{block.id} failed ({proc.returncode}):\n{block.code}\n--- output:\n{out.decode()}"
    )
