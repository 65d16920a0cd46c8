"""Issue 64: a change set's page shows its values through the app's own view (the daemons' ``get`` query, answered
with the app's ``describe()``): the built-in snapshot app's paths, values and versions, escaped; an app without a
view says so."""

from __future__ import annotations

import re

import aiohttp
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.console import serving_console


async def _page(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        return await response.text()


async def test_a_change_sets_page_shows_the_snapshot_apps_values(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    async with running_daemon(nc, settings, SnapshotApp()), serving_console(nc, settings.subjects) as console:
        updates = [
            SetLiteral(path="/web/port", value=8080),
            SetLiteral(path="/name", value="<b>web</b>"),
        ]
        reply = await client.enqueue_updates_with_reply(wk, cs, updates, timeout=20)
        assert reply.ok, reply
        page = await _page(f"{console.url}/change-sets/{wk}/{cs}")
        section = re.search(r'<section id="values">(.*?)</section>', page, re.S)
        assert section is not None, page
        rows = re.findall(r"<tr><td><code>([^<]*)</code></td><td><code>([^<]*)</code></td>", section[1])
        assert dict(rows) == {"/web/port": "8080", "/name": "&quot;&lt;b&gt;web&lt;/b&gt;&quot;"}, section[1]
        assert "<b>web</b>" not in page  # escaped: a value never becomes markup
        assert "snapshot <code>" in section[1]

        unknown = await _page(f"{console.url}/change-sets/{wk}/{ChangeSetId.new()}")
        assert "no record yet" in unknown


async def test_an_app_without_a_view_says_so(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    async with (
        running_daemon(nc, settings, RecordingApp()),
        serving_console(nc, settings.subjects) as console,
    ):
        reply = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=1)], timeout=20)
        assert reply.ok
        page = await _page(f"{console.url}/change-sets/{wk}/{cs}")
    shown = re.search(r'<p class="empty" id="no-view">([^<]*)</p>', page)
    assert shown is not None, page
    assert shown[1].startswith("the app has no view of its values: ") and "RecordingApp" in shown[1], shown[1]
