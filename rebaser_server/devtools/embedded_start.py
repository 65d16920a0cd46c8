"""Starting an embedded NATS (a server or the dev cluster) with the operator's two usual mistakes as one line."""

from __future__ import annotations

from collections.abc import Callable

import click

from rebaser_core.embedded.net import ADDR_IN_USE
from rebaser_core.errors import EmbeddedServerError, StoreInUse
from rebaser_core.nats.durability import check_sync

__all__ = ["start_embedded", "sync_option"]


def start_embedded(start: Callable[[], object], *, in_use: str, port_taken: str) -> None:
    """Call ``start``; a data directory held by another process (``in_use``, with ``{holder}`` for its pid) or a
    taken port (``port_taken``) becomes a :class:`click.ClickException`, anything else propagates."""
    try:
        start()
    except StoreInUse as err:
        holder = f" (pid {err.holder_pid})" if err.holder_pid else ""
        raise click.ClickException(in_use.format(holder=holder)) from None
    except EmbeddedServerError as err:
        if ADDR_IN_USE not in str(err):
            raise
        raise click.ClickException(port_taken) from None


def sync_option(_ctx: click.Context, _param: click.Parameter, value: str) -> str | None:
    """The ``--sync`` callback of ``rebaser-server`` and its dev cluster:
    :func:`~rebaser_core.nats.durability.check_sync`, its error as click's."""
    try:
        return check_sync(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
