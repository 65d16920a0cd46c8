"""``rebaser watch WK [CS]``: a live line per event of a change set, or of every change set of a workspace.

``--since N`` replays from after durable event N (one change set); ``--json`` prints each event as one JSON object
per line; ``--feed stream`` reads the events stream (notices too) instead of the records' writes. A gap in the feed
(events older than the feed keeps) is one line on stderr, and the watch goes on.
On a terminal each change set's state (owner, backlog, settled, DVU running) is kept up to date in place below
the lines (:mod:`~rebaser_client.admin.cli.watch_state`). Ctrl-C ends it. nats-py is imported once the options are
checked (``rebaser --help`` must answer at once).
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from rebaser_client.admin.cli.common import admin_connect, connection_options, parse_ulid, subjects_of
from rebaser_client.admin.cli.watch_state import WatchState
from rebaser_core.errors import RebaserError
from rebaser_core.ids import ChangeSetId, WorkspacePk

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient

    from rebaser_core.api import ChangeSetEvent

__all__ = ["event_line", "watch"]


def event_line(event: ChangeSetEvent, *, workspace: bool) -> str:
    """One event for people: time, change set (when following a workspace), seq, kind, what it says."""
    at = datetime.fromtimestamp(event.at, UTC).strftime("%H:%M:%S.%f")[:-3]
    where = f"{event.change_set_id} " if workspace else ""
    seq = f"#{event.seq}" if event.durable else f"(after #{event.seq})"
    parts: list[str] = []
    if event.request_id is not None:
        parts.append(f"request {event.request_id}")
    if event.status is not None and event.kind not in ("applied", "conflicts"):
        parts.append(event.status)
    if event.updates_performed is not None:
        parts.append(f"{event.updates_performed} updates")
    if event.conflicts is not None:
        parts.append(f"{event.conflicts} conflicts")
    if event.snapshot_address:
        parts.append(f"snapshot {event.snapshot_address[:16]}")
    if event.reason:
        parts.append(f"reason {event.reason}")
    if event.duration_s is not None:
        parts.append(f"{event.duration_s * 1000:.1f} ms")
    if event.error:
        parts.append(f"error {event.error}")
    if event.settled:
        parts.append("settled")
    if event.kind in ("taken", "released"):
        parts.append(f"owner {event.owner} epoch {event.epoch}")
    return f"{at} {where}{seq:>12} {event.kind:<13} {', '.join(parts)}".rstrip()


class _Display:
    """Prints each event's line; with ``live``, also each change set's state, in place below the lines (rich)."""

    def __init__(self, live: bool, workspace: bool, console: Any = None, *, notices: bool = True) -> None:
        self._workspace = workspace
        self._state = WatchState(notices)
        self._live: Any = None
        if live:
            from rich.live import Live
            from rich.text import Text

            self._text = Text
            self._live = Live(Text(""), console=console, auto_refresh=False, transient=True)

    def __enter__(self) -> Callable[[ChangeSetEvent], None]:
        if self._live is not None:
            self._live.__enter__()
        return self._show

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def _show(self, event: ChangeSetEvent) -> None:
        line = event_line(event, workspace=self._workspace)
        if self._live is None:
            click.echo(line)
            return
        self._state.update(event)
        self._live.console.print(line, highlight=False, markup=False)
        status = "\n".join(self._state.lines(workspace=self._workspace))
        self._live.update(self._text(status, style="bold"), refresh=True)


@click.command()
@connection_options
@click.argument("workspace")
@click.argument("change_set", required=False)
@click.option(
    "--since",
    type=click.IntRange(min=0),
    default=None,
    help="Replay from after this durable event seq (0: all the deployment keeps). Needs CHANGE_SET.",
)
@click.option(
    "--feed",
    type=click.Choice(["records", "stream"]),
    default="records",
    show_default=True,
    help="Where to read the events: the records' writes (every deployment), or the REBASER_EVENTS stream "
    "(daemons with events on: notices too).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event, one per line.")
def watch(
    nats_url: str,
    prefix: str | None,
    workspace: str,
    change_set: str | None,
    since: int | None,
    feed: str,
    as_json: bool,
) -> None:
    """Follow a change set's events (or, without CHANGE_SET, a whole workspace's) as they happen."""
    wk = parse_ulid(WorkspacePk, workspace, "WORKSPACE")
    cs = None if change_set is None else parse_ulid(ChangeSetId, change_set, "CHANGE_SET")
    if since is not None and cs is None:
        raise click.BadParameter("--since needs a CHANGE_SET (seqs are per change set)", param_hint="--since")
    subjects = subjects_of(prefix)

    async def follow(nc: NatsClient) -> None:
        from rebaser_client._events import EventStream
        from rebaser_core.errors import EventsLost

        with _Display(live, cs is None, notices=feed == "stream") as show:
            async with EventStream(
                nc, subjects, wk, cs, since, "stream" if feed == "stream" else "records"
            ) as stream:
                while True:
                    try:
                        event = await stream.__anext__()
                    except EventsLost as gap:
                        click.echo(f"gap: {gap}", err=True)
                        continue
                    except StopAsyncIteration:
                        return
                    if as_json:
                        click.echo(json.dumps(event.model_dump(mode="json"), separators=(",", ":")))
                    else:
                        show(event)

    # On a terminal, each change set's state (owner, backlog, settled, DVU running) is kept up to date under the
    # lines; written to a pipe or a file, only the lines.
    live = not as_json and sys.stdout.isatty()

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a watch ends
        _watch_until_stopped(nats_url, follow)


def _watch_until_stopped(nats_url: str, follow: Callable[[NatsClient], Awaitable[None]]) -> None:
    """Connect and follow until Ctrl-C (or the connection closes). The connection is closed, not drained: a
    watch has nothing to flush, and a drain would wait for the events still pushed to it (up to nats-py's 30 s)."""
    import asyncio

    async def main() -> None:
        # Ctrl-C and SIGTERM end the watch, whatever this process inherited (a parent that ignores SIGINT makes
        # Python leave it ignored, and asyncio then installs nothing for it).
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)
        nc = await admin_connect(nats_url)
        try:
            await follow(nc)
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        pass  # stopped by a signal: a watch's normal end
    except RebaserError as err:
        raise click.ClickException(f"{type(err).__name__}: {err}") from None
