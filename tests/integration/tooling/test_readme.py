"""The README's code, and that of the docs pages listed in ``PAGES``, runs as shown: every ```python block, and
every ```sh block marked ``runnable`` (in its info string, as the README does, or by a ``<!-- runnable -->`` line
right before the fence, which the docs site renders), against a daemon of its own (the default app, an embedded
nats-server on a free port), found through ``REBASER_NATS_URL``.

Blocks are run as a user would paste them: Python as a file with the project's interpreter, shell through
``bash -eu -o pipefail`` in a directory whose ``.venv/bin`` is this interpreter's, so ``.venv/bin/rebaser`` resolves.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# The pages whose blocks are pasted as they are: the README, and the page it sends a new user to.
PAGES = (ROOT / "README.md", ROOT / "docs" / "client.md")
# A fence at the start of a line (after an optional marker line): its info string, then the body up to the
# closing fence.
_FENCE = re.compile(r"^(<!-- runnable -->\n)?```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
_LISTENING = re.compile(rb"embedded nats-server listening on (nats://\S+)")


def page_blocks(page: Path) -> list[tuple[str, str]]:
    """(kind, code) of the page's blocks to run: kind is "python" or "sh"."""
    blocks = []
    for marker, info, body in _FENCE.findall(page.read_text()):
        words = info.split()
        if words[:1] == ["python"]:
            blocks.append(("python", body))
        elif words[:1] in (["sh"], ["console"], ["bash"]) and (marker or "runnable" in words[1:]):
            blocks.append(("sh", body))
    return blocks


def readme_blocks() -> list[tuple[str, str]]:
    """(kind, code) of every page's blocks to run, in ``PAGES`` order."""
    return [block for page in PAGES for block in page_blocks(page)]


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_the_page_has_runnable_blocks(page: Path) -> None:
    kinds = [kind for kind, _ in page_blocks(page)]
    assert "python" in kinds and "sh" in kinds, kinds


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


@pytest.mark.parametrize(
    ("kind", "code"),
    readme_blocks(),
    ids=[f"{page.stem}-{kind}-{n}" for page in PAGES for n, (kind, _) in enumerate(page_blocks(page))],
)
async def test_readme_block_runs(readme_daemon: str, tmp_path: Path, kind: str, code: str) -> None:
    workdir = tmp_path / "paste"
    (workdir / ".venv").mkdir(parents=True)
    (workdir / ".venv" / "bin").symlink_to(Path(sys.executable).parent)
    env = {**os.environ, "REBASER_NATS_URL": readme_daemon, "PYTHONPATH": str(ROOT)}
    env.pop("REBASER_PREFIX", None)
    if kind == "python":
        script = workdir / "example.py"
        script.write_text(code)
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-eu", "-o", "pipefail", "-c", code]
    proc = await asyncio.create_subprocess_exec(
        *argv,
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
        f"{kind} block failed ({proc.returncode}):\n{code}\n--- output:\n{out.decode()}"
    )
