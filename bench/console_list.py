"""The web console's change-set list with 10,000 rows (docs/console.md#benchmark): how long chromium takes to load
and lay it out, and how long the console takes to render it.

A deployment of its own on an embedded nats-server (127.0.0.1, a free port): ``--rows`` change-set records in the
records bucket (over 100 workspaces, a tenth of them with a request queued), the console served in this process on
them, and Debian's chromium (``apt-get install chromium``) driven by Playwright loading ``/change-sets`` ``--loads``
times. Each load is timed from the request to the ``load`` event, then to the first frame after it (every row laid
out), as the browser's Navigation Timing says; the console's own rendering of the page is timed apart.

    .venv/bin/python -m bench.console_list --rows 10000
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import nats
from aiohttp import web

from rebaser_client.admin.console.index import Filter
from rebaser_client.admin.console.live import Live
from rebaser_client.admin.console.pages import change_sets_body
from rebaser_client.admin.console.server import make_app, serving_port, set_port
from rebaser_core.api import ENQUEUE_UPDATES_REQUEST, EnqueueUpdatesRequest, InlineUpdates, SetLiteral
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.subjects import Subjects
from rebaser_core.testing import CHROMIUM, HEADLESS_CHROMIUM_ARGS
from rebaser_server.record.model import ChangeSetRecord
from rebaser_server.record.store import ChangeSetStore
from rebaser_server.testing import fast_settings

# Navigation Timing: from the request to the load event, and to the frame painted after it.
_TIMING = """() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => {
  const t = performance.getEntriesByType("navigation")[0];
  done({load: t.loadEventEnd, painted: performance.now(), bytes: t.transferSize, first_byte: t.responseStart,
        last_byte: t.responseEnd, interactive: t.domInteractive, ready: t.domContentLoadedEventEnd,
        rows: Number(document.getElementById("shown").textContent)});
})))"""


async def _fill(nc: nats.NATS, prefix: str, rows: int) -> Subjects:
    settings = fast_settings(prefix)
    js = nc.jetstream()
    await ensure_streams(js, settings)
    store = ChangeSetStore(js, settings)
    await store.open()
    kv = await js.key_value(settings.subjects.change_sets_bucket)
    workspaces = [WorkspacePk.new() for _ in range(100)]
    record = ChangeSetRecord(epoch=1, owner="bench:daemon", state={"applied": []}, applied_seq=0).encode()
    for i in range(rows):
        wk, cs = workspaces[i % len(workspaces)], ChangeSetId.new()
        await kv.put(Subjects.change_set_key(wk, cs), record)
        if i % 10 == 0:
            request = EnqueueUpdatesRequest(
                id=RequestId.new(),
                workspace_id=wk,
                change_set_id=cs,
                updates=InlineUpdates(updates=[SetLiteral(path="/a", value=i)]),
            )
            headers, body = ENQUEUE_UPDATES_REQUEST.encode(request)
            await js.publish(settings.subjects.requests(wk, cs), body, headers=headers)
    return settings.subjects


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--loads", type=int, default=3)
    options = parser.parse_args()
    from playwright.async_api import async_playwright

    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(store_dir=Path(tmp) / "nats")
        server.start()
        try:
            nc = await nats.connect(server.url)
            subjects = await _fill(nc, "b" + secrets.token_hex(4), options.rows)
            live = Live(nc, subjects, refresh=1.0)
            await live.start()
            deadline = time.monotonic() + 120
            while len(live.index.rows) < options.rows or not live.records_loaded:
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"the console knows {len(live.index.rows)} change sets of {options.rows}"
                    )
                await asyncio.sleep(0.1)
            started = time.perf_counter()
            html = change_sets_body(live.index, Filter(), read_only=False, loaded=True)
            render = time.perf_counter() - started
            app = make_app(live, token=None, read_only=False, port=0)
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = serving_port(site, 0)
            set_port(app, port)
            loads: list[dict[str, float]] = []
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(
                    executable_path=CHROMIUM, headless=True, args=HEADLESS_CHROMIUM_ARGS
                )
                for _ in range(options.loads):
                    page = await browser.new_page(viewport={"width": 1280, "height": 800})
                    await page.goto(f"http://127.0.0.1:{port}/change-sets", wait_until="load")
                    loads.append(await page.evaluate(_TIMING))
                    await page.close()
                await browser.close()
            await runner.cleanup()
            await live.stop()
            await nc.close()
        finally:
            server.stop()
    print(f"change-set list, {options.rows} rows ({len(html) / 1e6:.1f} MB of HTML)")
    print(f"  console renders the page: {render * 1000:.0f} ms")
    for i, t in enumerate(loads, 1):
        print(
            f"  load {i}: first byte {t['first_byte']:.0f} ms, last byte {t['last_byte']:.0f} ms, parsed "
            f"{t['interactive']:.0f} ms, load event {t['load']:.0f} ms, painted {t['painted']:.0f} ms, "
            f"{int(t['rows'])} rows, {t['bytes'] / 1e6:.1f} MB transferred"
        )
    print(f"  median painted: {statistics.median(t['painted'] for t in loads):.0f} ms")


if __name__ == "__main__":
    asyncio.run(main())
