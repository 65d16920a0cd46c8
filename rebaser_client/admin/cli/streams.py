"""``rebaser streams show|set|intake|repair``: the admin side of sharding and of the intake
(:mod:`rebaser_client.admin.streams` and :mod:`rebaser_client.admin.intake` do the work; ``repair``, which rewrites an
unreadable layout entry, :mod:`rebaser_client.admin.store_repairs`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from nats.aio.client import Client as NatsClient

from rebaser_client.admin.cli.common import Audited, record_action
from rebaser_client.admin.intake import change_intake
from rebaser_client.admin.store_repairs import repair_layout
from rebaser_client.admin.streams import change_streams, show_layout
from rebaser_core.errors import RebaserError
from rebaser_core.layout import AssignmentMode, Intake
from rebaser_core.nats.connect import ConnectOptions, close_connection, connect, redact_url
from rebaser_core.subjects import Subjects

__all__ = ["repair", "set_intake", "set_streams", "show"]

T = TypeVar("T")
_CONNECT_TIMEOUT = 2.0


def _run(nats_url: str, work: Callable[[NatsClient], Awaitable[T]], *, audited: Audited | None = None) -> T:
    """Connect, run ``work``, close; with ``audited``, the change is recorded in the audit trail (common.run)."""

    async def main() -> T:
        options = ConnectOptions(
            servers=(nats_url,),
            connect_timeout=_CONNECT_TIMEOUT,
            extra={"max_reconnect_attempts": 1, "reconnect_time_wait": 0.1},
        )
        try:
            nc = await connect(options)
        except Exception as err:
            raise click.ClickException(f"cannot connect to NATS at {redact_url(nats_url)}: {err}") from None
        try:
            if audited is None:
                return await work(nc)
            try:
                result = await work(nc)
            except (RebaserError, TimeoutError) as err:
                await record_action(nc, audited, "failed", [f"{type(err).__name__}: {err}"])
                raise
            await record_action(nc, audited, "ok", audited.lines(result))
            return result
        finally:
            await close_connection(nc)

    try:
        return asyncio.run(main())
    except (RebaserError, TimeoutError) as err:
        raise click.ClickException(f"{type(err).__name__}: {err}") from None


def _table(data: dict[str, Any]) -> str:
    state = (
        f", draining the previous {data['previous']}"
        if data["previous"] not in (None, data["streams"])
        else ""
    )
    if data.get("intake_from"):
        state += f", the intake changing from {data['intake_from']}"
    lines = [
        f"layout: {data['streams']} streams, {data['mode']}, {data.get('intake', 'fifo')} intake "
        f"(epoch {data['epoch']}){state}"
    ]
    head = (
        "shard",
        "leader",
        "servers",
        "requests",
        "tasks waiting",
        "tasks unacked",
        "pulling",
        "consumers",
    )
    rows: list[tuple[str, ...]] = [head]
    for s in data["shards"]:
        rows.append(
            tuple(
                "-" if v is None else str(v)
                for v in (
                    s["shard"],
                    s["leader"],
                    ",".join(s["servers"]) or None,
                    s["requests_waiting"],
                    s["tasks_waiting"],
                    s["tasks_unacked"],
                    s["pulling"],
                    s["consumers"],
                )
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for s in data["shards"]:
        if s["tasks_waiting"] and not s["pulling"]:
            lines.append(f"shard {s['shard']}: tasks wait and no daemon is pulling (see docs/operations.md)")
        if s.get("error"):
            lines.append(f"shard {s['shard']}: {s['error']}")
    return "\n".join(lines)


def show(nats_url: str, prefix: str | None, as_json: bool) -> None:
    data = _run(nats_url, lambda nc: show_layout(nc, Subjects(prefix)))
    click.echo(json.dumps(data, indent=2) if as_json else _table(data))


def set_streams(
    nats_url: str,
    prefix: str | None,
    streams: int,
    daemons: int | None,
    timeout: float,
    mode: AssignmentMode | None = None,
) -> None:
    layout = _run(
        nats_url,
        lambda nc: change_streams(
            nc, Subjects(prefix), streams, daemons=daemons, mode=mode, timeout=timeout, progress=click.echo
        ),
        audited=Audited(
            "streams-set",
            Subjects(prefix),
            [f"{streams} streams"],
            lambda layout: [f"layout: {layout.streams} streams, {layout.mode}"],
        ),
    )
    click.echo(f"layout: {layout.streams} streams, {layout.mode}")


def set_intake(nats_url: str, prefix: str | None, intake: Intake) -> None:
    layout = _run(
        nats_url,
        lambda nc: change_intake(nc, Subjects(prefix), intake, progress=click.echo),
        audited=Audited(
            "streams-intake",
            Subjects(prefix),
            [f"{intake} intake"],
            lambda layout: [f"layout: {layout.streams} streams, {layout.mode}, {layout.intake} intake"],
        ),
    )
    click.echo(f"layout: {layout.streams} streams, {layout.mode}, {layout.intake} intake")


def repair(nats_url: str, prefix: str | None, mode: AssignmentMode | None, as_json: bool) -> None:
    result = _run(
        nats_url,
        lambda nc: repair_layout(nc, Subjects(prefix), assignment=mode),
        audited=Audited(
            "streams-repair",
            Subjects(prefix),
            ["the layout entry"],
            lambda r: [f"rewritten from {r.source} ({r.found}): {r.layout.streams} streams, {r.layout.mode}"],
        ),
    )
    layout = result.layout
    if as_json:
        click.echo(
            json.dumps(
                {"found": result.found, "source": result.source, "layout": json.loads(layout.encode())}
            )
        )
        return
    source = "the last readable layout" if result.source == "history" else "the streams that exist"
    click.echo(f"the layout entry was unreadable ({result.found})")
    click.echo(
        f"rewritten from {source}: {layout.streams} streams, {layout.mode}, {layout.intake} intake "
        f"(epoch {layout.epoch}); waiting daemons start within seconds"
    )
