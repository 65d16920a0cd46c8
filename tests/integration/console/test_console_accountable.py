"""Issue 64, over HTTP against real nats-servers (no browser): an unknown state is refused; every action and every
refused request is logged as one JSON line saying who, from where, what, which targets and the outcome, and a pause
made from the console says who made it; a bulk pause says what really happened to change sets no daemon holds; a
request being retried shows its last error; and when the daemon and its NATS stop, the console shows the daemon's
health as it is now and the rest as stale, not live; with the feed off, a change set's page lays out cleanly."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import re
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_client._pausing import pause_of
from rebaser_client.admin.console.guard import AUDIT_LOGGER, CSRF_HEADER
from rebaser_core.api import EnqueueUpdatesRequest
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.subjects import Subjects
from rebaser_core.testing import wait_for
from rebaser_server.app import Applied, AppState, ChangeSet
from rebaser_server.testing import fast_settings, running_daemon
from tests.integration.client.test_pause_admin import store
from tests.integration.operations.test_metrics import metrics_url
from tests.support.apps import RecordingApp
from tests.support.console import chromium, screenshot_path, serving_console


@pytest.fixture
async def deployment(nc: NatsClient, subject_prefix: str) -> Subjects:
    """A deployment's streams and no daemon."""
    await ensure_streams(nc.jetstream(), fast_settings(subject_prefix))
    return Subjects(subject_prefix)


def _csrf(html: str) -> str:
    found = re.search(r'<meta name="csrf" content="([^"]+)">', html)
    assert found is not None
    return found[1]


def _audit(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == AUDIT_LOGGER]


async def test_an_unknown_state_is_refused_clearly(nc: NatsClient, deployment: Subjects) -> None:
    async with serving_console(nc, deployment) as console, aiohttp.ClientSession() as http:
        async with http.get(f"{console.url}/change-sets?state=bogus") as response:
            page = await response.text()
        assert response.status == 400
        assert "no such state: bogus" in page and "running, queued, paused, retrying, dead-lettered" in page
        assert "no change set matches" not in page and 'id="rows"' not in page
        async with http.get(f"{console.url}/change-sets?state=paused") as response:
            assert response.status == 200


async def test_actions_and_refusals_are_logged_with_who_and_what(
    nc: NatsClient, deployment: Subjects, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    wk = WorkspacePk.new()
    idle = [ChangeSetId.new(), ChangeSetId.new()]
    for cs in idle:
        await store(nc, deployment, wk, cs)  # queued, and no daemon holds it
    async with serving_console(nc, deployment) as console, aiohttp.ClientSession() as http:
        await wait_for(lambda: all(console.live.row_of(str(wk), str(cs)) for cs in idle), timeout=10)
        async with http.get(f"{console.url}/") as response:
            csrf = _csrf(await response.text())
        url = f"{console.url}/api/actions/pause"
        async with http.post(url, json={"filter": {"workspace": str(wk)}}) as response:
            assert response.status == 403  # no CSRF header
        async with http.get(f"{console.url}/", headers={"Host": "attacker.example:80"}) as response:
            assert response.status == 421
        async with http.post(
            url, json={"filter": {"workspace": str(wk)}}, headers={CSRF_HEADER: csrf}
        ) as response:
            plan = await response.json()
        assert plan["ok"] and len(plan["targets"]) == len(idle)
        async with http.post(
            url, json={**plan["body"], "confirm": True}, headers={CSRF_HEADER: csrf}
        ) as response:
            done = await response.json()
        assert done["ok"], done
        # A bulk pause of change sets no daemon holds says so, not that an owner lets them go.
        assert len(done["lines"]) == len(idle)
        assert all(line.endswith("; no daemon holds it") for line in done["lines"]), done["lines"]
        for cs in idle:
            own, _ = await pause_of(nc, deployment, wk, cs)
            assert own is not None and own.by == "local"  # who made it: a loopback console without a token

    lines = _audit(caplog)
    assert [(e["what"], e["outcome"], e["status"]) for e in lines] == [
        ("pause", "refused", 403),
        ("GET /", "refused", 421),
        ("pause (asked)", "asked", 200),
        ("pause (done)", "ok", 200),
    ]
    for entry in lines:
        assert entry["peer"] == "127.0.0.1" and entry["at"].endswith("Z") and entry["lines"], entry
    assert lines[0]["who"] == "local" and "X-Rebaser-CSRF" in lines[0]["lines"][0]
    assert lines[1]["who"] == "unauthenticated"
    done_entry = lines[3]
    assert done_entry["who"] == "local" and done_entry["path"] == "/api/actions/pause"
    assert sorted(done_entry["targets"]) == sorted(f"change set {wk}/{cs}" for cs in idle)


class Failing(RecordingApp):
    """Fails every request with an error whose message is long and holds markup."""

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        raise RuntimeError("<b>the ledger is locked</b> " + "x" * 1000)


async def test_a_request_being_retried_shows_its_last_error(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix, max_attempts=1000, retry_backoff_max=0.2)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    async with (
        running_daemon(nc, settings, Failing()),
        serving_console(nc, settings.subjects) as console,
        aiohttp.ClientSession() as http,
    ):
        await client.enqueue_updates(wk, cs, [SetLiteral(path="/a", value=1)])
        await wait_for(
            lambda: (row := console.live.row_of(str(wk), str(cs))) is not None and row.attempts >= 2,
            timeout=20,
            message="the request is being retried",
        )
        async with http.get(f"{console.url}/change-sets/{wk}/{cs}") as response:
            page = await response.text()
    assert "<th>last error</th>" in page
    shown = re.search(r'<span class="error" id="last-error">([^<]*)</span>', page)
    assert shown is not None, page
    assert shown[1].startswith("RuntimeError: &lt;b&gt;the ledger is locked&lt;/b&gt; xxx")
    assert len(shown[1]) < 400  # bounded


async def test_daemon_health_is_read_on_its_own_and_stale_data_shows_as_stale(
    own_server: NatsServer, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    daemon_nc = await nats.connect(own_server.url)
    console_nc = await nats.connect(own_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.5)
    daemon_stack = contextlib.AsyncExitStack()
    try:
        daemon = await daemon_stack.enter_async_context(running_daemon(daemon_nc, settings, RecordingApp()))
        health = (await daemon_stack.enter_async_context(metrics_url(daemon)))[: -len("/metrics")]
        async with (
            serving_console(console_nc, settings.subjects, daemon_urls=(health,)) as console,
            aiohttp.ClientSession() as http,
        ):
            async with RebaserClient(daemon_nc, prefix=subject_prefix) as client:
                reply = await client.enqueue_updates_with_reply(
                    WorkspacePk.new(), ChangeSetId.new(), [SetLiteral(path="/a", value=1)], timeout=20
                )
                assert reply.ok
            await wait_for(
                lambda: (
                    console.live.report is not None
                    and console.live.daemons is not None
                    and console.live.daemons.daemons[0].ready is True
                ),
                timeout=20,
                message="the console reads the deployment and the daemon's health",
            )
            async with http.get(f"{console.url}/") as response:
                page = await response.text()
            assert "<td>ready</td>" in page and "Stale" not in page and 'class="live"' in page
            # The daemon stops (its health endpoint with it), then its NATS.
            await daemon_stack.aclose()
            own_server.stop()
            await wait_for(
                lambda: (
                    console.live.problem is not None
                    and console.live.daemons is not None
                    and console.live.daemons.daemons[0].problem is not None
                ),
                timeout=30,
                message="the console's reads fail and the daemon is read as gone",
            )
            async with http.get(f"{console.url}/") as response:
                page = await response.text()
            assert "<td>ready</td>" not in page  # not the last report's health: the daemon's, read now
            assert "Stale: the console cannot read NATS" in page and "data-since=" in page
            assert 'class="live stale"' in page and 'id="problem" hidden' not in page
    finally:
        await daemon_stack.aclose()
        for conn in (console_nc, daemon_nc):
            with contextlib.suppress(Exception):
                await conn.close()


async def test_with_the_feed_off_the_page_lays_out_without_an_empty_timeline(
    nc: NatsClient, deployment: Subjects, tmp_path: Path
) -> None:
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    await store(nc, deployment, wk, cs)
    async with serving_console(nc, deployment) as console, chromium() as browser:
        await wait_for(
            lambda: console.live.feed_on is False and console.live.row_of(str(wk), str(cs)), timeout=10
        )
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        await page.goto(f"{console.url}/change-sets/{wk}/{cs}")
        await page.wait_for_selector("#live.on", timeout=20_000)
        await page.locator("#detail table.facts").wait_for(timeout=20_000)
        await page.screenshot(path=screenshot_path(tmp_path, "console-feed-off.png"), full_page=True)
        # Why there is no feed yet stands in place of the timeline: no empty table whose header runs into the facts.
        assert await page.locator("#timeline").count() == 0
        boxes = await page.evaluate(
            """() => [...document.querySelector("main").children].map(e => {
                const r = e.getBoundingClientRect();
                return [e.tagName + (e.id ? "#" + e.id : ""), r.top, r.bottom];
            })"""
        )
        for (above, _, bottom), (below, top, _) in itertools.pairwise(boxes):
            assert bottom <= top + 0.5, f"{above} overlaps {below}: {boxes}"
        banner = await page.locator("#feed-off").bounding_box()
        facts = await page.locator("#detail table.facts").bounding_box()
        assert banner is not None and facts is not None
        assert banner["y"] + banner["height"] < facts["y"]
