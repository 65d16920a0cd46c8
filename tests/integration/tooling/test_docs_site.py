"""The docs site (mkdocs.yml) draws every ```mermaid block as a diagram, and a page read fetches nothing from the
network: its scripts, styles and mermaid itself (vendored in docs/javascripts/) come from the site.

The built pages are checked as HTML: each diagram in the form the theme draws (``<pre class="mermaid"><code>``),
only local scripts and styles, the vendored mermaid on every page. Where Chromium is installed, the pages with
diagrams are also opened in it, served on 127.0.0.1, with every other address sent to a local proxy that only
records: each diagram must be drawn, and nothing may have been asked of the network.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import json
import os
import re
import shutil
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rebaser_core.testing import HEADLESS_CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
MKDOCS_YML = (ROOT / "mkdocs.yml").read_text()
_MERMAID_FENCE = re.compile(r"^```mermaid\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
_DRAWN = re.compile(r'<pre class="mermaid"><code>(.*?)</code></pre>', re.DOTALL)
_FETCHED = re.compile(
    r"<(?:script|img|iframe|source)\b[^>]*\bsrc=\"([^\"]*)\"|<link\b[^>]*\bhref=\"([^\"]*)\""
)
_CSS_URL = re.compile(r"url\(\s*['\"]?([^'\")]+)|@import\s+['\"]([^'\"]+)")
_VENDORED = re.compile(r"^  - (javascripts/mermaid-(\d+\.\d+\.\d+)\.min\.js)$", re.MULTILINE)
_SHA256 = re.compile(r"sha256 ([0-9a-f]{64})")


def diagrams(page: Path) -> list[str]:
    """The ```mermaid blocks of a docs page, as written."""
    return _MERMAID_FENCE.findall(page.read_text())


PAGES_WITH_DIAGRAMS = [page for page in sorted(DOCS.rglob("*.md")) if diagrams(page)]


def built(site: Path, page: Path) -> Path:
    """Where mkdocs writes the page (directory URLs: docs/design.md is design/index.html)."""
    relative = page.relative_to(DOCS).with_suffix("")
    return site / ("index.html" if relative.name == "index" else relative / "index.html")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_the_docs_have_diagrams() -> None:
    assert {page.name for page in PAGES_WITH_DIAGRAMS} >= {"design.md", "operations.md"}


def test_the_vendored_mermaid_is_the_pinned_release() -> None:
    found = _VENDORED.search(MKDOCS_YML)
    assert found is not None, "mkdocs.yml's extra_javascript names no javascripts/mermaid-X.Y.Z.min.js"
    script, version = found[1], found[2]
    data = (DOCS / script).read_bytes()
    pinned = _SHA256.search(MKDOCS_YML)
    assert pinned is not None, "mkdocs.yml records no sha256 of the vendored mermaid"
    assert hashlib.sha256(data).hexdigest() == pinned[1], f"docs/{script} is not the file mkdocs.yml pins"
    assert f'"{version}"'.encode() in data, f"docs/{script} is not mermaid {version}"
    assert "MIT License" in (DOCS / "javascripts" / "mermaid-LICENSE.txt").read_text()


@pytest.mark.parametrize("page", PAGES_WITH_DIAGRAMS, ids=[page.name for page in PAGES_WITH_DIAGRAMS])
def test_diagrams_are_built_as_the_theme_draws_them(site: Path, page: Path) -> None:
    built_page = built(site, page).read_text()
    assert [html.unescape(code).strip() for code in _DRAWN.findall(built_page)] == [
        diagram.strip() for diagram in diagrams(page)
    ]
    assert "language-mermaid" not in built_page  # not one shown as code


def test_pages_fetch_only_from_the_site(site: Path) -> None:
    script = _VENDORED.search(MKDOCS_YML)
    assert script is not None
    for page in sorted(site.rglob("*.html")):
        text = page.read_text()
        for found in _FETCHED.finditer(text):
            url = found[1] or found[2]
            tag = found[0]
            if 'rel="canonical"' in tag or 'rel="alternate"' in tag:
                continue  # links, not fetched
            where = f"{page.relative_to(site)}: {tag}"
            assert not re.match(r"^(?:[a-z]+:)?//", url), f"fetched from the network: {where}"
            local = url.split("#")[0].split("?")[0]
            target = (site / local.lstrip("/")) if local.startswith("/") else (page.parent / local).resolve()
            assert url.startswith(("data:", "#")) or target.exists(), f"not in the site: {where}"
        # The theme falls back to a CDN for mermaid when none is loaded: every page loads the vendored one.
        assert f'/{script[1]}"' in text or f'"{script[1]}"' in text, (
            f"{page.relative_to(site)} lacks {script[1]}"
        )
    for css in sorted(site.rglob("*.css")):
        for found in _CSS_URL.finditer(css.read_text()):
            url = found[1] or found[2]
            assert not re.match(r"^(?:[a-z]+:)?//", url.strip()), f"{css.relative_to(site)} fetches {url}"


# -- drawn in a browser --------------------------------------------------------------------------------------------
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


class _Recorder(socketserver.StreamRequestHandler):
    """A proxy that refuses everything and records what was asked of it (the first line of each request)."""

    asked: list[str]

    def handle(self) -> None:
        self.asked.append(self.rfile.readline(4096).decode(errors="replace").strip())
        self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def _serving(site: Path) -> Iterator[tuple[str, int, list[str]]]:
    """The site on 127.0.0.1 (its URL), and a recording proxy on 127.0.0.1 (its port, what was asked of it)."""
    asked: list[str] = []
    recorder = type("Recorder", (_Recorder,), {"asked": asked})
    with (
        ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(site))) as web,
        socketserver.ThreadingTCPServer(("127.0.0.1", 0), recorder) as proxy,
    ):
        for server in (web, proxy):
            threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{web.server_address[1]}/", proxy.server_address[1], asked
        finally:
            web.shutdown()
            proxy.shutdown()


@pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium here (apt-get install chromium): diagrams not drawn"
)
@pytest.mark.parametrize("page", PAGES_WITH_DIAGRAMS, ids=[page.name for page in PAGES_WITH_DIAGRAMS])
async def test_diagrams_are_drawn_offline(site: Path, page: Path, tmp_path: Path) -> None:
    """The page in headless Chromium, driven over the DevTools protocol: every request it makes (its scripts', the
    theme's included) is to the site, and every diagram is drawn (the theme swaps each ``pre.mermaid`` for a
    ``div.mermaid`` holding the SVG once mermaid has drawn it; a diagram mermaid cannot parse stays a ``pre``)."""
    assert CHROMIUM is not None
    path = built(site, page).parent.relative_to(site).as_posix()
    with _serving(site) as (url, proxy_port, _chromium_own_requests):
        # Chromium logs much; to a file, as a pipe nobody reads would fill and stop it.
        with (tmp_path / "chromium.log").open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                CHROMIUM,
                *HEADLESS_CHROMIUM_ARGS,
                f"--user-data-dir={tmp_path / 'profile'}",
                # Chromium's own calls home (updates, time, sign-in) go to the refusing recorder, not the network.
                f"--proxy-server=http://127.0.0.1:{proxy_port}",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "about:blank",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
            )
        try:
            async with asyncio.timeout(60):
                endpoint = await _devtools_endpoint(tmp_path / "chromium.log", proc)
                page_url = url if path == "." else f"{url}{path}/"
                requested, problems, drawn = await _open(endpoint, page_url, len(diagrams(page)))
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
    elsewhere = [r for r in requested if not r.startswith((url, "data:", "blob:", "about:"))]
    assert elsewhere == [], f"reading {page.name} asked the network for {elsewhere}"
    assert drawn == (len(diagrams(page)), 0), (
        f"{page.name}: (drawn, not drawn) = {drawn} of {len(diagrams(page))}; errors: {problems}"
    )


async def _devtools_endpoint(log: Path, proc: asyncio.subprocess.Process) -> str:
    """The browser's DevTools HTTP endpoint, from the line Chromium logs on start."""
    while True:
        text = await asyncio.to_thread(log.read_text, errors="replace")
        found = re.search(r"DevTools listening on ws://(127\.0\.0\.1:\d+)/", text)
        if found:
            return f"http://{found[1]}"
        if proc.returncode is not None:
            raise AssertionError(f"Chromium exited without a DevTools endpoint:\n{text}")
        await asyncio.sleep(0.05)


async def _open(endpoint: str, url: str, expected: int) -> tuple[list[str], list[str], tuple[int, int]]:
    """Opens ``url`` in the browser's page and waits for its ``expected`` diagrams: the URLs it requested, its
    errors, (diagrams drawn, not drawn)."""
    requested: list[str] = []
    problems: list[str] = []
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{endpoint}/json/list") as resp:
            target = next(t for t in await resp.json() if t["type"] == "page")
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 1_000_000))
            replies: dict[int, asyncio.Future[dict[str, Any]]] = {}

            async def call(method: str, **params: Any) -> dict[str, Any]:
                n = next(ids)
                reply = replies[n] = asyncio.get_running_loop().create_future()
                await ws.send_json({"id": n, "method": method, "params": params})
                return await asyncio.wait_for(reply, 10)

            async def read() -> None:
                async for msg in ws:
                    event = json.loads(msg.data)
                    if "id" in event:
                        replies.pop(event["id"]).set_result(event.get("result", {}))
                    elif event["method"] == "Network.requestWillBeSent":
                        requested.append(event["params"]["request"]["url"])
                    elif event["method"] == "Runtime.exceptionThrown":
                        details = event["params"]["exceptionDetails"]
                        problems.append(
                            str(details.get("exception", {}).get("description", details["text"]))[:500]
                        )
                    elif event["method"] == "Runtime.consoleAPICalled" and event["params"]["type"] == "error":
                        problems.append(
                            " ".join(
                                str(a.get("value", a.get("description"))) for a in event["params"]["args"]
                            )
                        )

            reader = asyncio.create_task(read())
            try:
                for method in ("Network.enable", "Runtime.enable", "Page.enable"):
                    await call(method)
                await call("Page.navigate", url=url)
                count = "['div.mermaid', 'pre.mermaid'].map(s => document.querySelectorAll(s).length)"
                drawn: tuple[int, int] = (0, -1)
                deadline = asyncio.get_running_loop().time() + 30
                # Until every diagram is drawn, or one fails, or 30 s (mermaid is slow on a loaded machine).
                while (
                    drawn != (expected, 0) and not problems and asyncio.get_running_loop().time() < deadline
                ):
                    await asyncio.sleep(0.05)
                    result = await call("Runtime.evaluate", expression=count, returnByValue=True)
                    value = result.get("result", {}).get("value") or [0, -1]
                    drawn = (int(value[0]), int(value[1]))
                await asyncio.sleep(0.2)  # requests made after the drawing are counted too
                return requested, problems, drawn
            finally:
                reader.cancel()
