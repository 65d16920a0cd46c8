"""Issue 64: the overview's charts over time (backlog, requests applied per second, dead letters, owned change sets),
drawn in a real browser (chromium) from the samples the console keeps, and moving, without a reload, while a daemon
applies requests."""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_client.admin.console.live import SAMPLES
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.console import chromium, serving_console

_CHART = """key => {
    const svg = document.querySelector(`#charts figure[data-key="${key}"] svg`);
    if (!svg) return null;
    const samples = JSON.parse(document.querySelector("#charts").dataset.samples);
    return {n: Number(svg.dataset.n), end: Number(svg.dataset.end), points: svg.querySelector("polyline")
        .getAttribute("points").split(" ").filter(Boolean).length, values: samples[key]};
}"""


async def test_the_overview_charts_appear_and_move_as_requests_are_applied(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    stop = asyncio.Event()
    sent = 0

    async def load() -> None:
        nonlocal sent
        targets = [(WorkspacePk.new(), ChangeSetId.new()) for _ in range(3)]
        while not stop.is_set() and sent < 5_000:
            for wk, cs in targets:
                await client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=sent)])
                sent += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    await stop.wait()

    async with (
        chromium() as browser,
        running_daemon(nc, settings, RecordingApp()),
        serving_console(nc, settings.subjects) as console,
    ):
        loading = asyncio.create_task(load())
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            await page.goto(f"{console.url}/")
            await page.wait_for_selector("#live.on", timeout=20_000)
            await page.evaluate("window.notReloaded = true")
            seen: list[object] = []

            async def drawn_with_requests_applied() -> bool:
                charts = {k: await page.evaluate(_CHART, k) for k in ("backlog", "rate", "dead", "owned")}
                seen.append(charts)
                if any(c is None or c["n"] < 2 or c["points"] != c["n"] for c in charts.values()):
                    return False
                return any(v is not None and v > 0 for v in charts["rate"]["values"])

            try:
                await wait_for(drawn_with_requests_applied, timeout=30, interval=0.3, message="charts drawn")
            except AssertionError:
                raise AssertionError(
                    f"the four charts drawn, requests applied: not so, {seen[-1:]}"
                ) from None
            first = await page.evaluate(_CHART, "rate")

            async def moved() -> bool:
                now = await page.evaluate(_CHART, "rate")
                return now is not None and now["end"] > first["end"]

            await wait_for(moved, timeout=30, interval=0.3, message="the chart moves with the next samples")
            assert await page.evaluate("window.notReloaded") is True  # moved by the live updates alone
            assert len(console.live.samples) <= SAMPLES
            assert sent > 0
            await page.close()
        finally:
            stop.set()
            await loading
