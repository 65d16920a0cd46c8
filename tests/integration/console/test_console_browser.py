"""The web console in a real browser (Debian's chromium, driven by Playwright), against an in-process daemon under
load at the defaults (the event feed carried by the records' writes): a change set's timeline grows live; pausing
one stops its requests being applied and resuming it lets them through; a request refused by the app lands in the
dead letters and is replayed from the console; the list filters by workspace and pauses a whole filter at once.
Every action asks first (the dialog) and shows its outcome. The pages' screenshots (docs/console.md) are taken here
(``make screenshots``).

One browser, one daemon and one console serve the whole module (its own event loop): starting them is most of a
browser test's cost."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_client._pausing import pause_of
from rebaser_core.api import EnqueueUpdatesRequest
from rebaser_core.embedded import NatsServer
from rebaser_core.errors import UnprocessableError
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.subjects import Subjects
from rebaser_core.testing import wait_for
from rebaser_server.app import Applied, AppState, ChangeSet
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.testing import fast_settings, running_daemon
from tests.integration.operations.test_metrics import metrics_url
from tests.support.apps import RecordingApp, applied
from tests.support.console import Console, chromium, screenshot_path, serving_console

pytestmark = pytest.mark.asyncio(loop_scope="module")

_LOAD_BOUND = 20_000  # requests the load sends at most, whatever happens


class RefusingApp(RecordingApp):
    """Refuses (UnprocessableError: a dead letter at once) every request setting ``/refuse`` while ``refusing``."""

    def __init__(self) -> None:
        super().__init__()
        self.refusing = True

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        paths = {u.path for u in getattr(request.updates, "updates", ()) if isinstance(u, SetLiteral)}
        if self.refusing and "/refuse" in paths:
            raise UnprocessableError("refused until the test says otherwise")
        return await super().apply(change_set, state, request)


@dataclass
class Deployment:
    nc: NatsClient
    client: RebaserClient
    subjects: Subjects
    daemon: Daemon
    app: RefusingApp
    console: Console
    browser: Any
    shots: Path
    w1: WorkspacePk = field(default_factory=WorkspacePk.new)
    w2: WorkspacePk = field(default_factory=WorkspacePk.new)
    busy: list[tuple[WorkspacePk, ChangeSetId]] = field(default_factory=list)  # under load, in w1
    others: list[tuple[WorkspacePk, ChangeSetId]] = field(default_factory=list)  # under load, in w2
    sent: int = 0

    async def applied(self, wk: WorkspacePk, cs: ChangeSetId) -> list[str]:
        return await applied(self.daemon.store, wk, cs)

    async def page(self, path: str) -> Any:
        page = await self.browser.new_page(viewport={"width": 1280, "height": 800})
        await page.goto(self.console.url + path)
        await page.wait_for_selector("#live.on", timeout=20_000)  # its live updates are connected
        return page


async def _load(d: Deployment, stop: asyncio.Event) -> None:
    """Requests to every change set under load, round after round, until the module ends (bounded in count)."""
    targets = d.busy + d.others
    while not stop.is_set() and d.sent < _LOAD_BOUND:
        for wk, cs in targets:
            await d.client.enqueue_updates(wk, cs, [SetLiteral(path="/n", value=d.sent)])
            d.sent += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.05):  # paced: a steady load, not a flood
                await stop.wait()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def deployment(
    nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Deployment]:
    async with chromium() as browser:
        prefix = "t" + secrets.token_hex(5)
        nc = await nats.connect(nats_server.url)
        console_nc = await nats.connect(nats_server.url)
        app = RefusingApp()
        settings = fast_settings(prefix)
        stop = asyncio.Event()
        load: asyncio.Task[None] | None = None
        try:
            async with (
                RebaserClient(nc, prefix=prefix) as client,
                running_daemon(nc, settings, app) as daemon,
                metrics_url(daemon) as metrics,
                serving_console(
                    console_nc, Subjects(prefix), daemon_urls=(metrics[: -len("/metrics")],)
                ) as console,
            ):
                shots = tmp_path_factory.mktemp("shots")
                d = Deployment(nc, client, Subjects(prefix), daemon, app, console, browser, shots)
                d.busy = [(d.w1, ChangeSetId.new()) for _ in range(3)]
                d.others = [(d.w2, ChangeSetId.new()) for _ in range(3)]
                load = asyncio.create_task(_load(d, stop))
                yield d
                stop.set()
                await load
        finally:
            stop.set()
            if load is not None and not load.done():
                load.cancel()
            for conn in (console_nc, nc):
                with contextlib.suppress(Exception):
                    await conn.close()


async def _confirm(page: Any, action: Any) -> str:
    """Click ``action`` (a button locator), check that the console asks, say yes; the outcome's text."""
    await action.click()
    dialog = page.locator("dialog#confirm")
    await dialog.wait_for(state="visible", timeout=10_000)
    question = await dialog.locator(".question").inner_text()
    assert question.endswith("?"), question
    await dialog.locator("button.yes").click()
    outcome = page.locator("#outcome p")
    await outcome.first.wait_for(timeout=30_000)
    return str(await page.locator("#outcome").inner_text())


async def test_a_change_sets_timeline_updates_live(deployment: Deployment) -> None:
    d = deployment
    wk, cs = d.busy[0]
    page = await d.page(f"/change-sets/{wk}/{cs}")
    rows = page.locator("#timeline tbody tr.ev")
    await rows.first.wait_for(timeout=20_000)
    await page.evaluate("window.notReloaded = true")
    rid = await d.client.enqueue_updates(wk, cs, [SetLiteral(path="/marker", value=1)])
    # The request's outcome arrives by itself: the page is not reloaded.
    await page.locator(f"#timeline tr:has-text('request {rid}')").wait_for(timeout=20_000)
    assert await page.evaluate("window.notReloaded") is True
    assert await page.locator("#detail .badge").count() >= 1
    await page.screenshot(path=screenshot_path(d.shots, "console-change-set.png"), full_page=False)
    await page.close()


async def test_pause_stops_a_change_set_skip_and_resume(deployment: Deployment) -> None:
    d = deployment
    wk, cs = d.busy[1]
    sentinel = d.busy[2]
    await wait_for(
        lambda: d.applied(wk, cs), timeout=20, message="the change set under load applies requests"
    )
    page = await d.page(f"/change-sets/{wk}/{cs}")
    outcome = await _confirm(page, page.locator("#detail button.act[data-action=pause]"))
    assert f"paused change set {wk}/{cs}" in outcome and "no daemon holds it" in outcome, outcome
    await page.locator("#detail .badge.paused").wait_for(timeout=20_000)  # the page says so, live
    held = len(await d.applied(wk, cs))
    # While the load goes on, its neighbour goes on being applied and it does not.
    before = len(await d.applied(*sentinel))

    async def neighbour_moved_on() -> bool:
        return len(await d.applied(*sentinel)) >= before + 10

    await wait_for(neighbour_moved_on, timeout=30, message="the other change sets are still applied")
    assert len(await d.applied(wk, cs)) == held, "a paused change set had requests applied"
    # Skip: the first request in line moves to the dead letters (asked first, like `rebaser change-set skip`).
    skip = page.locator("#detail button.act[data-action=skip]")
    await skip.wait_for(timeout=20_000)
    outcome = await _confirm(page, skip)
    assert "skipped request" in outcome and "the change set stays paused" in outcome, outcome
    assert len(await d.applied(wk, cs)) == held
    outcome = await _confirm(page, page.locator("#detail button.act[data-action=resume]"))
    assert f"resumed change set {wk}/{cs}" in outcome, outcome

    async def applied_again() -> bool:
        return len(await d.applied(wk, cs)) > held + 1

    await wait_for(applied_again, timeout=30, message="resumed, the change set is applied again")
    await page.close()


async def test_a_dead_letter_is_replayed_from_the_console(deployment: Deployment) -> None:
    d = deployment
    wk, cs = d.w1, ChangeSetId.new()
    reply = await d.client.enqueue_updates_with_reply(
        wk, cs, [SetLiteral(path="/refuse", value=1)], timeout=20
    )
    assert not reply.ok
    d.app.refusing = False  # the app is fixed: a replay is applied
    page = await d.page(f"/dead-letters?workspace={wk}&change_set={cs}")
    row = page.locator("#letters tbody tr[id^=dl-]")
    await row.first.wait_for(timeout=20_000)
    assert await row.count() == 1
    assert "refused until the test says otherwise" in await row.first.inner_text()
    await page.screenshot(path=screenshot_path(d.shots, "console-dead-letters.png"))
    outcome = await _confirm(page, row.first.locator("button.act[data-action=replay]"))
    assert "replayed as request" in outcome, outcome
    replayed = outcome.split("replayed as request ")[1].split()[0]

    async def applied_now() -> bool:
        return replayed in await d.applied(wk, cs)

    await wait_for(applied_now, timeout=30, message="the replayed request is applied")
    await page.locator("#letters tr.empty").wait_for(timeout=20_000)  # gone from the list, live
    await page.close()


async def test_filter_by_workspace_and_pause_the_whole_filter(deployment: Deployment) -> None:
    d = deployment
    page = await d.page("/change-sets")
    await page.locator(f"#rows tr[data-ws='{d.w1}']").first.wait_for(timeout=20_000)
    await page.fill("input[name=workspace]", str(d.w2))
    await page.click("form#filter button[type=submit]")
    rows = page.locator("#rows tbody tr[id]")
    await rows.first.wait_for(timeout=20_000)
    await page.wait_for_function(
        "n => document.querySelectorAll('#rows tbody tr[id]').length === n", arg=len(d.others), timeout=20_000
    )
    assert set(await rows.evaluate_all("rows => rows.map(r => r.dataset.ws)")) == {str(d.w2)}
    await page.screenshot(path=screenshot_path(d.shots, "console-change-sets.png"))
    # The dialog names every change set the bulk action takes.
    await page.locator("button.act", has_text="Pause every change set listed").click()
    await page.locator("dialog#confirm").wait_for(state="visible")
    assert await page.locator("dialog#confirm .targets li").count() == len(d.others)
    await page.screenshot(path=screenshot_path(d.shots, "console-confirm.png"))
    await page.locator("dialog#confirm button.yes").click()
    await page.locator("#outcome p").first.wait_for(timeout=30_000)
    lines = await page.locator("#outcome p").all_inner_texts()
    assert sum(line.startswith("paused change set") for line in lines) == len(d.others), lines
    for wk, cs in d.others:
        own, _ = await pause_of(d.nc, d.subjects, wk, cs)
        assert own is not None and own.cause == "operator"
    await page.wait_for_function(
        "n => document.querySelectorAll('#rows .badge.paused').length === n",
        arg=len(d.others),
        timeout=20_000,
    )
    outcome = await _confirm(page, page.locator("button.act", has_text="Resume every change set listed"))
    assert outcome.count("resumed change set") == len(d.others), outcome
    await page.close()


async def test_the_overview_shows_the_daemon_and_the_workspaces(deployment: Deployment) -> None:
    d = deployment
    page = await d.page("/")
    await page.locator(f"main a:has-text('{d.w1}')").wait_for(timeout=20_000)
    await page.locator("main td:has-text('ready')").wait_for(
        timeout=20_000
    )  # the daemon's health, from /status
    assert "event feed" in await page.locator("table.facts").inner_text()
    await page.screenshot(path=screenshot_path(d.shots, "console-overview.png"))
    await page.close()


async def _idle(d: Deployment, wk: WorkspacePk, n: int) -> list[ChangeSetId]:
    """``n`` change sets of ``wk`` that applied a request and that no daemon holds any more."""
    targets = [ChangeSetId.new() for _ in range(n)]
    for cs in targets:
        reply = await d.client.enqueue_updates_with_reply(
            wk, cs, [SetLiteral(path="/a", value=1)], timeout=20
        )
        assert reply.ok
    await wait_for(
        lambda: not d.daemon.owned_by_workspace.get(str(wk)), timeout=30, message="the daemon lets them go"
    )
    await wait_for(
        lambda: all(
            (row := d.console.live.row_of(str(wk), str(cs))) is not None and row.task == "none" and row.owner
            for cs in targets
        ),
        timeout=30,
        message="the console sees that no daemon holds them",
    )
    return targets


_MEASURE_ID = """tr => {
    const a = tr.cells[0].querySelector("a.id"), head = a.querySelector(".id-head");
    const tail = a.querySelector(".id-tail"), cell = tr.cells[0].getBoundingClientRect();
    const end = tail.getBoundingClientRect();
    return {
        title: a.title, text: a.textContent, tail: tail.textContent,
        cut: head.scrollWidth > head.clientWidth,
        inside: end.width > 0 && end.right <= cell.right && end.left >= cell.left,
    };
}"""


async def _shown_cut_at_its_start(row: Any, change_set: str) -> None:
    """Wait until ``row`` shows the id cut at its start, its last ten characters whole inside the cell. Measured in
    one go (live updates redraw the rows on screen), and again until it holds: under load a row drawn anew may not
    be laid out yet."""
    wanted = {"title": change_set, "text": change_set, "tail": change_set[-10:], "cut": True, "inside": True}
    seen: list[object] = []

    async def as_wanted() -> bool:
        seen.append(await row.evaluate(_MEASURE_ID))
        return seen[-1] == wanted

    try:
        await wait_for(as_wanted, timeout=20, interval=0.2, message="the id cut at its start")
    except AssertionError:
        raise AssertionError(f"the id shown as {seen[-3:]}, not {wanted}") from None


async def test_ids_show_their_end_owners_say_last_and_the_state_counts_follow_the_list(
    deployment: Deployment,
) -> None:
    d = deployment
    wk = WorkspacePk.new()
    idle = await _idle(d, wk, 2)
    page = await d.page(f"/change-sets?workspace={wk}")
    # A column narrower than an id (as wider fonts make it): the id must be cut, and its end still shown.
    # A rule of the page's style sheet (the console's policy allows no inline style), not the element's style: a
    # live update may draw the table anew.
    await page.evaluate(
        "(() => { const sheet = document.styleSheets[0];"
        " sheet.insertRule('#rows th:nth-child(1) { width: 12em; }', sheet.cssRules.length); })()"
    )
    for cs in idle:
        row = page.locator(f"#rows tr[data-cs='{cs}']")
        await row.wait_for(timeout=20_000)
        # The id's distinguishing end is shown whole, inside its cell though the start is cut; the whole id is its
        # title and its text (what a copy takes).
        await _shown_cut_at_its_start(row, str(cs))
        # Nobody holds it: its owner is the last one, said as such.
        owner = d.console.live.row_of(str(wk), str(cs))
        assert owner is not None
        assert await row.locator("td").nth(3).inner_text() == f"last: {owner.owner}"
    await page.screenshot(path=screenshot_path(d.shots, "console-ids.png"))
    # A bulk pause of change sets nobody holds says so; the state drop-down counts them at once.
    outcome = await _confirm(page, page.locator("button.act", has_text="Pause every change set listed"))
    assert outcome.count("no daemon holds it") == len(idle) and "lets it go" not in outcome, outcome
    await wait_for(
        lambda: all(
            "paused" in d.console.live.index.states(d.console.live.row_of(str(wk), str(cs))) for cs in idle
        ),
        timeout=20,
        message="the console sees the pauses",
    )
    paused = d.console.live.index.state_counts()["paused"]
    await page.wait_for_function(
        "n => document.querySelector('select[name=state] option[value=paused]').textContent === `paused (${n})`",
        arg=paused,
        timeout=20_000,
    )
    outcome = await _confirm(page, page.locator("button.act", has_text="Resume every change set listed"))
    assert outcome.count("resumed change set") == len(idle), outcome
    await page.close()


async def test_the_dead_letters_count_and_pages_follow_a_replay(deployment: Deployment) -> None:
    d = deployment
    wk, cs = d.w1, ChangeSetId.new()
    d.app.refusing = True
    for n in range(2):
        reply = await d.client.enqueue_updates_with_reply(
            wk, cs, [SetLiteral(path="/refuse", value=n)], timeout=20
        )
        assert not reply.ok
    d.app.refusing = False
    listing = await d.page(f"/dead-letters?workspace={wk}&change_set={cs}")
    rows = listing.locator("#letters tbody tr[id^=dl-]")
    await listing.wait_for_function("() => document.querySelectorAll('#letters tr[id^=dl-]').length === 2")
    assert await listing.locator("#dead-letters-count").inner_text() == "2 dead letters"
    assert await listing.locator("button.act", has_text="Replay these 2").count() == 1
    seq = (await rows.first.get_attribute("id") or "").removeprefix("dl-")
    letter = await d.page(f"/dead-letters/{seq}")
    assert f"Dead letter {seq}" in await letter.locator("h1").inner_text()
    outcome = await _confirm(listing, rows.first.locator("button.act[data-action=replay]"))
    assert "replayed as request" in outcome, outcome
    # The count, the bulk buttons and the list change together, live; so does the replayed dead letter's page.
    await listing.locator("#dead-letters-count", has_text="1 dead letter").wait_for(timeout=20_000)
    assert await listing.locator("button.act", has_text="Replay these 1").count() == 1
    assert await listing.locator("button.act", has_text="Replay these 2").count() == 0
    assert await listing.locator("h1").count() == 1  # the page is not nested in itself
    await letter.locator("p.empty", has_text=f"no dead letter at sequence {seq}").wait_for(timeout=20_000)
    await letter.close()
    await listing.close()
