"""The container tests' engine and images (``make container-test``; not part of ``make test``).

Every test here is marked ``container``. Where no container can run (no root, no podman, no namespaces) they all
skip, and the run ends with one line saying why. What they measured, and what they left out, is printed at the end
of the run too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pytest

from tests.support.podman import ROOT, Podman, base_image, unavailable

NOTES: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if NOTES:
        terminalreporter.section("container tests")
        for line in NOTES:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def note() -> Callable[[str], None]:
    """Adds a line to the summary printed at the end of the run."""
    return NOTES.append


@pytest.fixture(scope="session")
def podman() -> Podman:
    engine = Podman()
    reason = unavailable(engine)
    if reason:
        NOTES.append(f"skipped, no container can run here: {reason}")  # one line, not one per test
        pytest.skip(reason)
    return engine


@pytest.fixture(scope="session")
def base(podman: Podman, note: Callable[[str], None]) -> str:
    started = time.monotonic()
    tag = base_image(podman)
    note(f"debian base {tag}: ready in {time.monotonic() - started:.1f}s (cached between runs)")
    return tag


@pytest.fixture(scope="session")
def rebaser_image(podman: Podman, base: str, note: Callable[[str], None]) -> Iterator[str]:
    """The project's own Dockerfile, built on the local base (its BASE_IMAGE argument); removed after the run."""
    tag = f"localhost/rebaser:test-{os.getpid()}"
    started = time.monotonic()
    podman.build(tag, ROOT / "Dockerfile", ROOT, {"BASE_IMAGE": base})
    note(f"rebaser image from the Dockerfile: built in {time.monotonic() - started:.1f}s")
    try:
        yield tag
    finally:
        podman("rmi", "--force", tag, check=False)
