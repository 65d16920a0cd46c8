"""Issue 64: the audit trail in the console. An action done from the console (in a real browser) and one done with
the ``rebaser`` command are both listed on the console's Audit page, reached from its navigation, with who did
them; an action whose record cannot be written is done all the same and the console says the entry is missing."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
from click.testing import CliRunner
from nats.aio.client import Client as NatsClient
from nats.js import api as js_api

from rebaser_client import RebaserClient, SetLiteral
from rebaser_client._pausing import pause_of
from rebaser_client.admin.audit import cli_identity, entries
from rebaser_client.admin.cli.main import main as cli
from rebaser_client.admin.console.guard import CSRF_HEADER
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.streams import audit_stream_config, ensure_streams
from rebaser_core.subjects import Subjects
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.integration.client.test_pause_admin import store
from tests.support.apps import RecordingApp
from tests.support.console import chromium, screenshot_path, serving_console


def _csrf(html: str) -> str:
    found = re.search(r'<meta name="csrf" content="([^"]+)">', html)
    assert found is not None
    return found[1]


async def test_console_and_cli_actions_are_listed_on_the_audit_page(
    nc: NatsClient, client: RebaserClient, nats_url: str, subject_prefix: str, tmp_path: Path
) -> None:
    settings = fast_settings(subject_prefix)
    wk, by_console, by_cli = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
    async with chromium() as browser, running_daemon(nc, settings, RecordingApp()):
        for cs in (by_console, by_cli):
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/a", value=1)], timeout=20
            )
            assert reply.ok
        argv = ["change-set", "pause", str(wk), str(by_cli), "--no-wait"]
        done = await asyncio.to_thread(
            CliRunner().invoke, cli, [*argv, "--nats-url", nats_url, "--prefix", subject_prefix]
        )
        assert done.exit_code == 0, done.output
        async with serving_console(nc, settings.subjects) as console:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{console.url}/change-sets/{wk}/{by_console}")
            await page.locator("#detail button.act[data-action=pause]").click()
            dialog = page.locator("dialog#confirm")
            await dialog.wait_for(state="visible", timeout=20_000)
            await dialog.locator("button.yes").click()
            await page.locator("#outcome p").first.wait_for(timeout=30_000)
            outcome = await page.locator("#outcome").inner_text()
            assert f"paused change set {wk}/{by_console}" in outcome, outcome
            assert "audit entry is missing" not in outcome

            await page.locator("header nav a", has_text="Audit").click()
            rows = page.locator("#audit tbody tr")

            async def both_listed() -> bool:
                # Read again until it holds (the page is the newest entries as of its load).
                if await rows.count() < 2:
                    await page.reload()
                    return False
                return True

            await wait_for(both_listed, timeout=20, interval=0.5, message="the audit page lists both")
            texts = await rows.all_inner_texts()
            assert f"change set {wk}/{by_console}" in texts[0] and "console" in texts[0], texts
            assert "local" in texts[0] and "pause" in texts[0] and "ok" in texts[0], texts
            assert f"change set {wk}/{by_cli}" in texts[1] and cli_identity() in texts[1], texts
            assert "cli" in texts[1], texts
            assert await page.locator("header nav a.on").inner_text() == "Audit"
            # Long ids and what the operator was told wrap: nothing is cut off at the window's edge.
            overflow = await page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 0, f"the audit page is {overflow}px wider than the window"
            await page.screenshot(path=screenshot_path(tmp_path, "console-audit.png"))
            await page.close()


async def test_a_console_action_whose_record_fails_is_done_and_says_so(
    nc: NatsClient, subject_prefix: str
) -> None:
    await ensure_streams(nc.jetstream(), fast_settings(subject_prefix))
    subjects = Subjects(subject_prefix)
    # The audit stream (the daemons made it) is full and refuses more (discard new).
    full = audit_stream_config(subjects, storage=js_api.StorageType.MEMORY)
    full.max_msgs, full.discard = 1, js_api.DiscardPolicy.NEW
    await nc.jetstream().update_stream(full)
    await nc.jetstream().publish(subjects.audit("filler"), b"{}")
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    await store(nc, subjects, wk, cs)
    async with serving_console(nc, subjects) as console, aiohttp.ClientSession() as http:
        async with http.get(f"{console.url}/") as response:
            csrf = _csrf(await response.text())
        body = {"targets": [{"workspace_id": str(wk), "change_set_id": str(cs)}], "confirm": True}
        async with http.post(
            f"{console.url}/api/actions/pause", json=body, headers={CSRF_HEADER: csrf}
        ) as response:
            assert response.status == 200
            done = await response.json()
        assert done["ok"] and done["audited"] is False, done
        assert done["lines"][0].startswith(f"paused change set {wk}/{cs}"), done
        assert done["lines"][-1].startswith("the audit entry is missing (the action is done all the same): ")
        own, _ = await pause_of(nc, subjects, wk, cs)
        assert own is not None and own.by == "local"
        assert (await entries(nc, subjects))[0] == 1  # the filler alone
        async with http.get(f"{console.url}/audit") as response:
            page = await response.text()
        assert response.status == 200 and "the newest 1 of 1 entries" in page
