"""The console's guard, over HTTP (no browser): off loopback it needs its token (the command refuses to start
without one, and a browser without it is refused, actions included); an action needs the page's CSRF header and no
foreign Origin; a Host that is not the console's own is refused; a read-only console refuses every action. And what
the pages say when the event feed is off, and finding a change set by its id."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest
from click.testing import CliRunner
from nats.aio.client import Client as NatsClient
from nats.js.api import StorageType

from rebaser_client._pausing import pause_of, pause_workspace
from rebaser_client.admin.cli.main import main as cli
from rebaser_client.admin.console.guard import CSRF_HEADER, cookie_value, identity_of
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.subjects import Subjects
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings
from tests.integration.client.test_pause_admin import store
from tests.support.console import chromium, serving_console

TOKEN = secrets.token_urlsafe(24)


@pytest.fixture
async def deployment(nc: NatsClient, subject_prefix: str) -> Subjects:
    """A deployment's streams (the feed off, as by default) and no daemon."""
    await ensure_streams(nc.jetstream(), fast_settings(subject_prefix))
    return Subjects(subject_prefix)


def _csrf(html: str) -> str:
    found = re.search(r'<meta name="csrf" content="([^"]+)">', html)
    assert found is not None
    return found[1]


def test_the_command_will_not_bind_another_address_without_a_token() -> None:
    result = CliRunner().invoke(cli, ["console", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "not a loopback address: give --token" in result.output


@contextlib.asynccontextmanager
async def console_process(*args: str, output: list[str] | None = None) -> AsyncIterator[str]:
    """``rebaser console ARGS`` in a subprocess; the URL it serves on (by 127.0.0.1). Stopped by its PID; then
    ``output`` gets every line it wrote (standard output and error), the first one included."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from rebaser_client.admin.cli.main import main; main()",
        "console",
        "--port",
        "0",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=dict(os.environ),
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        if output is not None:
            output.append(line)
        found = re.search(r"serving (https?)://[^:]+:(\d+)/", line)
        assert found is not None, line + (await proc.stdout.read()).decode()
        yield f"{found[1]}://127.0.0.1:{found[2]}"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if output is not None and proc.stdout is not None:
            output.extend((await proc.stdout.read()).decode().splitlines())


async def test_off_loopback_every_request_needs_the_token(
    nc: NatsClient, nats_url: str, deployment: Subjects
) -> None:
    wk = WorkspacePk.new()
    args = ("--host", "0.0.0.0", "--token", TOKEN, "--nats-url", nats_url, "--prefix", str(deployment.prefix))
    output: list[str] = []
    async with console_process(*args, output=output) as url, chromium() as browser:
        stranger = await browser.new_context()
        page = await stranger.new_page()
        response = await page.goto(f"{url}/change-sets")
        assert response is not None and response.status == 401
        assert "needs its token" in await page.inner_text("body")
        # An action without the token is refused, whatever else it carries.
        refused = await stranger.request.post(
            f"{url}/api/actions/pause",
            data={"targets": [{"workspace_id": str(wk), "change_set_id": None}], "confirm": True},
            headers={CSRF_HEADER: "anything"},
        )
        assert refused.status == 401 and "needs its token" in (await refused.json())["lines"][0]

        operator = await browser.new_context()
        page = await operator.new_page()
        await page.goto(f"{url}/change-sets?workspace={wk}&token={TOKEN}")  # the token becomes a cookie
        assert page.url == f"{url}/change-sets?workspace={wk}"
        # ... a cookie that holds a value derived from the token, not the token.
        (cookie,) = await operator.cookies()
        assert cookie["httpOnly"] and cookie["value"] == cookie_value(TOKEN) and TOKEN not in cookie["value"]
        await page.locator("button.act", has_text="Pause the workspace").click()
        await page.locator("dialog#confirm button.yes").click()
        outcome = page.locator("#outcome p").first
        await outcome.wait_for(timeout=20_000)
        assert (await outcome.inner_text()).startswith(f"paused workspace {wk}")
        csrf = _csrf(await page.content())
        foreign = await operator.request.post(
            f"{url}/api/actions/resume",
            data={"targets": [{"workspace_id": str(wk), "change_set_id": None}]},
            headers={CSRF_HEADER: csrf, "Origin": "http://example.invalid"},
        )
        assert foreign.status == 403 and "not from this console" in (await foreign.json())["lines"][0]
        await stranger.close()
        await operator.close()
    # The line it printed gives a URL a person can open, and says it listens on every interface.
    assert re.search(r"serving http://127\.0\.0\.1:\d+/ \(listening on all interfaces", output[0]), output[0]
    # The pause says who made it: the token's identity (never the token).
    _, pause = await pause_of(nc, deployment, wk, ChangeSetId.new())  # its workspace's pause
    assert pause is not None and pause.by == identity_of(TOKEN)
    # Each action and each refusal is one JSON line: who, from where, what, the outcome.
    audit = [json.loads(line) for line in output if line.startswith("{")]
    assert not any(TOKEN in line for line in output)
    seen = [(e["who"], e["what"], e["outcome"], e["status"]) for e in audit]
    assert ("unauthenticated", "GET /change-sets", "refused", 401) in seen, seen
    assert ("unauthenticated", "pause", "refused", 401) in seen, seen
    assert (identity_of(TOKEN), "pause (done)", "ok", 200) in seen, seen
    assert (identity_of(TOKEN), "resume", "refused", 403) in seen, seen
    done = next(e for e in audit if e["what"] == "pause (done)")
    assert done["targets"] == [f"workspace {wk}"] and done["peer"] == "127.0.0.1", done


async def test_actions_need_the_csrf_header_and_the_console_as_host(
    nc: NatsClient, deployment: Subjects
) -> None:
    async with serving_console(nc, deployment) as console, aiohttp.ClientSession() as http:
        async with http.get(f"{console.url}/") as response:
            assert response.status == 200
            assert "default-src 'self'" in response.headers["Content-Security-Policy"]
            csrf = _csrf(await response.text())
        body = {"targets": [{"workspace_id": str(WorkspacePk.new()), "change_set_id": None}]}
        async with http.post(f"{console.url}/api/actions/pause", json=body) as response:
            assert response.status == 403
            assert CSRF_HEADER in (await response.json())["lines"][0]
        async with http.post(
            f"{console.url}/api/actions/pause", json=body, headers={CSRF_HEADER: csrf}
        ) as response:
            plan = await response.json()
            assert response.status == 200 and plan["ok"] and plan["question"].startswith("Pause workspace")
        # A page elsewhere that reaches the console through a name of its own (DNS rebinding) is not answered.
        async with http.get(f"{console.url}/", headers={"Host": "attacker.example:80"}) as response:
            assert response.status == 421


async def test_a_read_only_console_refuses_every_action(nc: NatsClient, deployment: Subjects) -> None:
    async with serving_console(nc, deployment, read_only=True) as console, aiohttp.ClientSession() as http:
        async with http.get(f"{console.url}/change-sets") as response:
            html = await response.text()
        assert "read-only" in html and 'class="act' not in html
        body = {"seqs": [1], "confirm": True}
        async with http.post(
            f"{console.url}/api/actions/drop", json=body, headers={CSRF_HEADER: _csrf(html)}
        ) as response:
            assert response.status == 403
            assert "read-only" in (await response.json())["lines"][0]


async def test_the_pages_say_why_there_is_no_feed_before_a_daemon_started(
    nc: NatsClient, deployment: Subjects
) -> None:
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    await store(nc, deployment, wk, cs)  # a request queued: the change set is known from the streams
    async with serving_console(nc, deployment) as console, aiohttp.ClientSession() as http:
        await wait_for(
            lambda: console.live.feed_on is False and console.live.row_of(str(wk), str(cs)), timeout=10
        )
        async with http.get(f"{console.url}/") as response:
            assert "No event feed yet: no daemon has started" in await response.text()
        async with http.get(f"{console.url}/change-sets/{wk}/{cs}") as response:
            page = await response.text()
        assert "No event feed yet: no daemon has started on this deployment" in page
        assert "1 request" in page  # the rest of the page is there all the same
        # Any change set is found by its id, and so is a workspace (an id's end is not an id).
        async with http.get(f"{console.url}/find?id={cs}", allow_redirects=False) as response:
            assert response.status == 303 and response.headers["Location"] == f"/change-sets/{wk}/{cs}"
        async with http.get(f"{console.url}/find?id={str(cs)[-14:]}", allow_redirects=False) as response:
            assert response.status == 200 and "no change set or workspace" in await response.text()
        async with http.get(f"{console.url}/find?id={wk}", allow_redirects=False) as response:
            assert response.status == 303 and response.headers["Location"] == f"/change-sets?workspace={wk}"


async def test_ten_browsers_share_the_consoles_watches(nc: NatsClient, subject_prefix: str) -> None:
    """Ten open pages cost NATS nothing more than one: no consumer of their own on the records, the pauses or the
    event feed (the records' writes: the console's one set of watches serves them all)."""
    settings = fast_settings(subject_prefix)
    await ensure_streams(nc.jetstream(), settings)
    subjects = settings.subjects
    js = nc.jetstream()
    await js.create_key_value(bucket=subjects.change_sets_bucket, storage=StorageType.MEMORY)
    await pause_workspace(
        nc, subjects, WorkspacePk.new(), "held"
    )  # the pauses bucket, created as an operator does

    async def consumers() -> dict[str, int]:
        found = {}
        for stream in (
            f"KV_{subjects.pauses_bucket}",
            f"KV_{subjects.change_sets_bucket}",
        ):
            try:
                found[stream] = (await js.stream_info(stream)).state.consumer_count
            except Exception:
                found[stream] = -1  # not there
        return found

    async with serving_console(nc, subjects) as console, aiohttp.ClientSession() as http:
        await wait_for(lambda: console.live.feed_on, timeout=10, message="the console follows the feed")
        await wait_for(
            lambda: console.live.index.workspace_pauses, timeout=10, message="it watches the pauses"
        )
        one = await consumers()
        assert min(one.values()) >= 1, one  # the console's own watches, and nothing else
        streams = [await http.get(f"{console.url}/stream?page=list") for _ in range(10)]
        try:
            await wait_for(
                lambda: len(console.live.hub) == 10, timeout=10, message="ten pages follow the list"
            )
            assert await consumers() == one
        finally:
            for response in streams:
                response.close()
