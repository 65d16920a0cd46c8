"""The web console for tests: served in process on a free port of 127.0.0.1 (:func:`serving_console`), and Debian's
chromium driven by Playwright (:func:`chromium`), or a skip that says in one line why it cannot be.

The browser is the package's (``apt-get install chromium``, which ``.ci/run`` does), never Playwright's own
download; it reaches 127.0.0.1 only. Playwright starts it with a fresh temporary profile (``--user-data-dir``) and
ends it, and its driver, on ``close``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from nats.aio.client import Client as NatsClient

from rebaser_client.admin.console.live import Live
from rebaser_client.admin.console.server import make_app, serving_port, set_port
from rebaser_core.subjects import Subjects
from rebaser_core.testing import CHROMIUM, HEADLESS_CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parents[2]
# `make screenshots` (REBASER_SCREENSHOTS=docs) writes the pages the browser tests see into docs/images (shown by
# docs/console.md); other runs write them into the test's temporary directory, so a test run leaves docs/ alone.
SCREENSHOTS_TO_DOCS = os.environ.get("REBASER_SCREENSHOTS") == "docs"


@dataclass
class Console:
    url: str
    live: Live


@asynccontextmanager
async def serving_console(
    nc: NatsClient,
    subjects: Subjects,
    *,
    token: str | None = None,
    read_only: bool = False,
    refresh: float = 0.5,
    daemon_urls: tuple[str, ...] = (),
) -> AsyncIterator[Console]:
    live = Live(nc, subjects, refresh=refresh, overview_every=2, daemon_urls=daemon_urls)
    app = make_app(live, token=token, read_only=read_only, port=0)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await live.start()
    try:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = serving_port(site, 0)
        set_port(app, port)
        yield Console(f"http://127.0.0.1:{port}", live)
    finally:
        await runner.cleanup()
        await live.stop()


@asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    """A headless chromium (Playwright's Browser), or the test skips with one line saying what is missing."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(
            f"{CHROMIUM} is not installed (apt-get install chromium): the console's browser tests skip"
        )
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.skip(
            "the playwright package is not installed (pip install -e '.[dev]'): the browser tests skip"
        )
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=HEADLESS_CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            await browser.close()


def screenshot_path(tmp: Path, name: str) -> Path:
    if SCREENSHOTS_TO_DOCS:
        folder = ROOT / "docs" / "images"
        folder.mkdir(exist_ok=True)
        return folder / name
    return tmp / name
