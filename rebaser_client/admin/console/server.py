"""The console's web server (aiohttp, the web stack the daemon's health endpoint uses too): the pages, the live
updates (server-sent events from the :class:`~rebaser_client.admin.console.hub.Hub`), the actions and the assets.

Every request goes through :func:`~rebaser_client.admin.console.guard.guard` before it reaches a page (a token off
loopback, the Host, an action's CSRF header and Origin, read-only mode), and every action, asked and done, is
logged on the audit logger (:func:`~rebaser_client.admin.console.guard.audit`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from rebaser_client.admin.audit import entries as audit_entries
from rebaser_client.admin.audit import make_entry, missing_line, record
from rebaser_client.admin.console import actions
from rebaser_client.admin.console.guard import CONFIG, audit, cookie_value, guard, identity_of, what_of
from rebaser_client.admin.console.html import esc, link, page
from rebaser_client.admin.console.index import STATES, Filter
from rebaser_client.admin.console.live import FEED_OFF, Live
from rebaser_client.admin.console.pages import audit_body, change_sets_body, live_overview
from rebaser_client.admin.console.pages_detail import change_set_body, dead_letter_body
from rebaser_client.admin.console.sse import serve_stream
from rebaser_client.admin.console.views import detail_html, letters_filter, letters_html, values_html
from rebaser_client.admin.dead_letters import dead_letter
from rebaser_core.errors import RebaserError
from rebaser_core.ids import ChangeSetId, WorkspacePk

__all__ = ["make_app", "serving_port", "set_port"]

_STATIC = {"console.js": "text/javascript", "console.css": "text/css"}
LIVE: web.AppKey[Live] = web.AppKey("live", Live)


def make_app(live: Live, *, token: str | None, read_only: bool, port: int) -> web.Application:
    """The console's application; ``port`` is the one it serves on (its own ``Host`` names it)."""
    app = web.Application(middlewares=[guard], client_max_size=1024 * 1024)
    app[LIVE] = live
    app[CONFIG] = {
        "token": token,
        "cookie": None if token is None else cookie_value(token),
        "identity": identity_of(token),
        "read_only": read_only,
        "csrf": secrets.token_urlsafe(32),
    }
    set_port(app, port)
    app.on_shutdown.append(_close_streams)
    app.router.add_get("/", overview)
    app.router.add_get("/change-sets", change_sets)
    app.router.add_get("/change-sets/{wk}/{cs}", one_change_set)
    app.router.add_get("/dead-letters", letters)
    app.router.add_get("/dead-letters/{seq:[0-9]+}", one_letter)
    app.router.add_get("/audit", audit_page)
    app.router.add_get("/find", find)
    app.router.add_get("/stream", stream)
    app.router.add_post("/api/actions/{name}", action)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/favicon.ico", no_icon)
    return app


async def _close_streams(app: web.Application) -> None:
    app[LIVE].hub.close()


def set_port(app: web.Application, port: int) -> None:
    """The port the console serves on: without a token, a request's Host must be this console's own."""
    app[CONFIG]["hosts"] = {f"{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]")}


def serving_port(site: web.TCPSite, asked: int) -> int:
    """The port ``site`` listens on (``asked``, unless that was 0)."""
    server: Any = site._server  # aiohttp keeps the asyncio server private; its sockets say the port
    for sock in getattr(server, "sockets", None) or ():
        return int(sock.getsockname()[1])
    return asked


# -- pages -----------------------------------------------------------------------------------------------------------
def _page(
    request: web.Request, *, title: str, section: str, body: str, stream: str, banner: str | None = None
) -> web.Response:
    config, live = request.app[CONFIG], request.app[LIVE]
    html = page(
        title=title,
        section=section,
        body=body,
        csrf=config["csrf"],
        stream=stream,
        read_only=config["read_only"],
        problem=live.problem,
        banner=banner,
        stale_since=live.health()["stale_since"],
    )
    return web.Response(text=html, content_type="text/html")


async def overview(request: web.Request) -> web.Response:
    live = request.app[LIVE]
    body = live_overview(live, live.report)
    banner = FEED_OFF if live.feed_on is False else None
    return _page(
        request,
        title="Overview",
        section="overview",
        body=body,
        stream="/stream?page=overview",
        banner=banner,
    )


async def change_sets(request: web.Request) -> web.Response:
    live, config = request.app[LIVE], request.app[CONFIG]
    unknown = Filter.unknown_state(request.query)
    if unknown is not None:
        body = (
            f'<h1>Change sets</h1><p class="problem" id="refused">no such state: {esc(unknown)}. A change set\'s '
            f"states are {esc(', '.join(STATES))} ({link('/change-sets', 'every change set')}).</p>"
        )
        response = _page(request, title="Change sets", section="change-sets", body=body, stream="")
        response.set_status(400)
        why = f"no such state: {unknown}"
        audit(request, what_of(request), "refused", status=400, lines=[why], who=config["identity"])
        return response
    flt = Filter.parse(request.query)
    body = change_sets_body(live.index, flt, read_only=config["read_only"], loaded=live.records_loaded)
    query = urlencode({"page": "list", **flt.query()})
    return _page(request, title="Change sets", section="change-sets", body=body, stream=f"/stream?{query}")


def _ids(request: web.Request) -> tuple[WorkspacePk, ChangeSetId]:
    try:
        return WorkspacePk(request.match_info["wk"]), ChangeSetId(request.match_info["cs"])
    except ValueError:
        raise web.HTTPNotFound(text="not a workspace and change set id (ULIDs)\n") from None


async def one_change_set(request: web.Request) -> web.Response:
    live = request.app[LIVE]
    wk, cs = _ids(request)
    since_text = request.query.get("since", "").strip()
    since = int(since_text) if since_text.isdigit() else None
    detail = await detail_html(live, wk, cs, read_only=request.app[CONFIG]["read_only"])
    body = change_set_body(str(wk), str(cs), detail, since=since, feed_on=live.feed_on)
    # Its values as the app shows them (the daemons' get query), as of this page's load.
    body += f"<h2>Values, as the app shows them</h2>{await values_html(live, wk, cs)}"
    query = {
        "page": "cs",
        "wk": str(wk),
        "cs": str(cs),
        **({"since": str(since)} if since is not None else {}),
    }
    return _page(
        request,
        title=f"Change set {cs}",
        section="change-sets",
        body=body,
        stream=f"/stream?{urlencode(query)}",
    )


async def letters(request: web.Request) -> web.Response:
    query = letters_filter(request.query)
    body = await letters_html(request.app[LIVE], query, read_only=request.app[CONFIG]["read_only"])
    return _page(
        request,
        title="Dead letters",
        section="dead-letters",
        body=body,
        stream=f"/stream?{urlencode({'page': 'dlq', **query})}",
    )


async def one_letter(request: web.Request) -> web.Response:
    live, config = request.app[LIVE], request.app[CONFIG]
    seq = int(request.match_info["seq"])
    letter = await dead_letter(live.nc, live.subjects, seq)
    if letter is None:
        body = (
            f'<h1>Dead letter {seq}</h1><p class="empty">no dead letter at sequence {seq}: replayed or dropped '
            '(see <a href="/dead-letters">the list</a>)</p>'
        )
    else:
        body = dead_letter_body(letter, read_only=config["read_only"])
    # Kept live: once it is replayed or dropped (here or anywhere), the page reloads and says so.
    stream = f"/stream?{urlencode({'page': 'dl', 'seq': seq})}" if letter is not None else ""
    return _page(request, title=f"Dead letter {seq}", section="dead-letters", body=body, stream=stream)


async def find(request: web.Request) -> web.Response:
    """A change set by its id (or the first characters of it: any change set the console knows, idle ones too),
    a workspace by its id, or ``WORKSPACE/CHANGE_SET`` (read from NATS even if the console has not seen it)."""
    live = request.app[LIVE]
    text = request.query.get("id", "").strip().upper()
    if text.count("/") == 1:
        raise web.HTTPSeeOther(f"/change-sets/{text}")
    rows = live.index.rows.values()
    by_id = [r for r in rows if r.change_set_id == text]
    if len(by_id) == 1:
        raise web.HTTPSeeOther(f"/change-sets/{by_id[0].workspace_id}/{text}")
    if any(r.workspace_id == text for r in rows):
        raise web.HTTPSeeOther(f"/change-sets?{urlencode({'workspace': text})}")
    found = live.index.find(text)
    change_sets = [r for r in found if r.change_set_id.startswith(text)]
    workspaces = sorted({r.workspace_id for r in found if r.workspace_id.startswith(text)})
    if len(change_sets) == 1 and not workspaces:
        raise web.HTTPSeeOther(f"/change-sets/{change_sets[0].workspace_id}/{change_sets[0].change_set_id}")
    if len(workspaces) == 1 and not change_sets:
        raise web.HTTPSeeOther(f"/change-sets?{urlencode({'workspace': workspaces[0]})}")
    items = [f"<li>workspace {link('/change-sets', w, {'workspace': w})}</li>" for w in workspaces[:100]] + [
        f"<li>{link(f'/change-sets/{r.workspace_id}/{r.change_set_id}', f'{r.workspace_id}/{r.change_set_id}')}</li>"
        for r in change_sets[:200]
    ]
    body = f"<h1>Find {esc(text)}</h1>" + (
        f"<ul>{''.join(items)}</ul>"
        if items
        else '<p class="empty">no change set or workspace the console knows has that id (give at least 6 '
        "characters of it, or WORKSPACE/CHANGE_SET)</p>"
    )
    return _page(request, title="Find", section="change-sets", body=body, stream="")


async def audit_page(request: web.Request) -> web.Response:
    """The newest entries of the audit trail (``?limit=``, 100 by default)."""
    live = request.app[LIVE]
    text = request.query.get("limit", "").strip()
    limit = min(int(text), 1000) if text.isdigit() else 100
    try:
        total, found = await audit_entries(live.nc, live.subjects, limit=limit)
        body = audit_body(total, found)
    except RebaserError as err:
        body = audit_body(0, [], problem=f"the audit trail cannot be read: {type(err).__name__}: {err}")
    return _page(request, title="Audit trail", section="audit", body=body, stream="")


async def no_icon(request: web.Request) -> web.Response:
    return web.Response(status=204)  # there is none: no 404 in every browser's log


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in _STATIC:
        raise web.HTTPNotFound()
    text = resources.files("rebaser_client.admin.console").joinpath("static", name).read_text()
    return web.Response(text=text, content_type=_STATIC[name], charset="utf-8")


# -- actions ---------------------------------------------------------------------------------------------------------
async def action(request: web.Request) -> web.Response:
    live, config = request.app[LIVE], request.app[CONFIG]
    who = config["identity"]
    name = request.match_info["name"]

    def answer(
        data: dict[str, Any], status: int = 200, *, outcome: str, phase: str, targets: Sequence[str] = ()
    ) -> web.Response:
        audit(
            request,
            f"{name} ({phase})",
            outcome,
            status=status,
            targets=targets,
            lines=data.get("lines") or [data.get("question", "")],
            who=who,
        )
        return web.json_response(data, status=status)

    if config["read_only"]:
        lines = ["this console is read-only: actions are off"]
        return answer({"ok": False, "lines": lines}, 403, outcome="refused", phase="asked")
    if request.content_type != "application/json":
        return answer({"ok": False, "lines": ["an action is JSON"]}, 415, outcome="refused", phase="asked")
    phase = "asked"
    targets: list[str] = []
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        if body.get("confirm"):
            phase, targets = "done", actions.targets_of(name, body)
            outcome = await actions.run(live, name, body, by=who)
            lines = list(outcome.lines)
            entry = make_entry(
                who=who,
                source="console",
                what=name,
                targets=targets,
                outcome="ok" if outcome.ok else "failed",
                lines=lines,
                peer=request.remote,
                forwarded_for=request.headers.get("X-Forwarded-For"),
            )
            # Done is done: a record that cannot be written is said, never a reason to undo or hide the action.
            missing = await record(live.nc, live.subjects, entry)
            if missing is not None:
                lines.append(missing_line(missing))
            data = {"ok": outcome.ok, "lines": lines, "audited": missing is None}
            return answer(data, outcome="ok" if outcome.ok else "failed", phase=phase, targets=targets)
        planned = await actions.plan(live, name, body)
    except RebaserError as err:
        data = {"ok": False, "lines": [f"{type(err).__name__}: {err}"]}
        return answer(data, outcome="refused", phase=phase, targets=targets)
    except (KeyError, ValueError, TypeError) as err:
        data = {"ok": False, "lines": [f"malformed action: {err!r}"]}
        return answer(data, 400, outcome="refused", phase=phase, targets=targets)
    data = {"ok": True, "question": planned.question, "targets": planned.targets, "body": planned.body}
    return answer(data, outcome="asked", phase=phase, targets=planned.targets)


# -- live updates ----------------------------------------------------------------------------------------------------
async def stream(request: web.Request) -> web.StreamResponse:
    return await serve_stream(request, request.app[LIVE], read_only=request.app[CONFIG]["read_only"])
