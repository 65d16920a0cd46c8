"""``/stream``: a page's live updates, as server-sent events. Each connection subscribes to the topics its page
shows (:class:`~rebaser_client.admin.console.hub.Hub`); the NATS side is the console's, shared by all.

Events sent: ``rows`` (list rows to put in or take out, by the page's filter), ``overview`` (the overview's body),
``event`` (a timeline row), ``detail`` and ``dead-letters`` (a part of the page read again after a change) and
``reload`` (the page is out of date: the feed was turned on or off, or this browser fell behind). A change set's
page gets the events the stream keeps first (from its ``since``), then the new ones; the browser drops one it has.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from rebaser_client.admin.console.hub import Message
from rebaser_client.admin.console.index import Filter, Row
from rebaser_client.admin.console.live import Live
from rebaser_client.admin.console.pages import list_counts, live_overview, row_data
from rebaser_client.admin.console.pages_detail import event_html
from rebaser_client.admin.console.views import detail_html, letters_filter, letters_html
from rebaser_client.admin.dead_letters import dead_letter
from rebaser_core.ids import ChangeSetId, WorkspacePk

__all__ = ["serve_stream"]

_KEEPALIVE = 15.0  # seconds between two comments on a quiet stream (proxies close silent ones)
_SETTLE = 0.3  # a burst of changes is read again once, this long after its first


def _sse(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _row(message: Message, row: Row, live: Live) -> list[Any]:
    """A row's data, made once per message whatever the number of browsers it goes to."""
    data: list[Any] | None = message.cache.get(row.key)
    if data is None:
        data = message.cache[row.key] = row_data(row, live.index.states(row))
    return data


def _event(message: Message) -> bytes:
    data: bytes | None = message.cache.get("sse")
    if data is None:
        event = message.data
        data = message.cache["sse"] = _sse("event", {"id": str(event.id), "html": event_html(event)})
    return data


async def serve_stream(request: web.Request, live: Live, *, read_only: bool) -> web.StreamResponse:
    kind = request.query.get("page", "")
    flt = Filter.parse(request.query)
    letters = letters_filter(request.query)
    wk = cs = None
    seq: int | None = None
    topics = {"feed", "rows"}
    if kind == "overview":
        topics = {"feed", "overview"}
    elif kind == "dlq":
        topics = {"feed", "dead-letters"}
    elif kind == "dl":
        topics = {"dead-letters"}
        text = request.query.get("seq", "")
        seq = int(text) if text.isdigit() else None
    elif kind == "cs":
        try:
            wk, cs = WorkspacePk(request.query["wk"]), ChangeSetId(request.query["cs"])
        except (KeyError, ValueError):
            raise web.HTTPBadRequest(text="a change set's stream needs its ids\n") from None
        topics.add(f"cs:{wk}.{cs}")
    topics.add("health")  # every page: the console's reads failing (stale) or not
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    await response.prepare(request)
    try:
        with live.hub.subscribe(*topics) as sub:
            if wk is not None and cs is not None and live.feed_on:
                since = request.query.get("since", "")
                for event in await live.history(wk, cs, int(since) if since.isdigit() else None):
                    await response.write(_sse("event", {"id": str(event.id), "html": event_html(event)}))
            due: float | None = None  # when to read the page's part again (a change was seen)
            while True:
                message = await sub.next(_KEEPALIVE if due is None else max(0.0, due - time.monotonic()))
                if due is not None and time.monotonic() >= due:
                    seen, due = due - _SETTLE, None
                    if wk is not None and cs is not None:
                        html = await detail_html(live, wk, cs, read_only=read_only, newer_than=seen)
                        await response.write(_sse("detail", {"html": html}))
                    elif kind == "dlq":
                        html = await letters_html(
                            live, letters, read_only=read_only, newer_than=seen, part=True
                        )
                        await response.write(_sse("dead-letters", {"html": html}))
                    elif kind == "dl" and seq is not None:
                        # One dead letter's page: once it is replayed or dropped, the page says so.
                        gone = await live.shared(
                            ("dl", seq), lambda: dead_letter(live.nc, live.subjects, seq), newer_than=seen
                        )
                        if gone is None:
                            await response.write(_sse("reload", {}))
                if message is None:
                    if due is None:
                        await response.write(b": keep-alive\n\n")
                elif message.topic == "close":
                    break
                elif message.topic in ("resync", "feed"):
                    await response.write(_sse("reload", {}))
                elif message.topic == "overview":
                    if "html" not in message.cache:
                        body = live_overview(live, message.data)
                        message.cache["html"] = body
                    await response.write(_sse("overview", {"html": message.cache["html"]}))
                elif message.topic == "health":
                    await response.write(_sse("health", message.data))
                elif message.topic.startswith("cs:"):
                    await response.write(_event(message))
                elif message.topic == "dead-letters":
                    due = due or time.monotonic() + _SETTLE
                elif message.topic == "rows":
                    rows: list[Row] = message.data
                    if kind == "list":
                        upsert = [_row(message, r, live) for r in rows if live.index.matches(flt, r)]
                        remove = [
                            f"r-{r.workspace_id}-{r.change_set_id}"
                            for r in rows
                            if not live.index.matches(flt, r)
                        ]
                        if "counts" not in message.cache:  # once per message, whatever the browsers
                            message.cache["counts"] = list_counts(live.index)
                        update = {"upsert": upsert, "remove": remove, "counts": message.cache["counts"]}
                        await response.write(_sse("rows", update))
                    elif any(r.key == (str(wk), str(cs)) for r in rows):
                        due = due or time.monotonic() + _SETTLE
    except (ConnectionResetError, ConnectionError):
        pass  # the browser went away
    return response
