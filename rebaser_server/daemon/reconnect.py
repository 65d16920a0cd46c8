"""What a daemon does after every reconnect to NATS: calls lost with the old connection end, owned change sets are
handed back, streams and buckets are made sure of, the durability is checked again, and orphans are swept.

A restarted nats-server has lost every memory-storage ordered consumer. Each would be replaced only after two silent
heartbeats (``consumer_heartbeat``: over 10 s at the default; rebaser_server.changeset.consumer), and the daemon
cannot cheaply tell which survived, so it hands every owned change set back (finish the request in hand, nack the
task) and takes them again with fresh consumers. A reconnect is rare; one re-acquire per owned change set is its
whole cost.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from rebaser_core.nats.streams import ensure_layout_streams
from rebaser_server.changeset.owning import Owning
from rebaser_server.daemon.owned import OwnedChangeSets
from rebaser_server.record.reader import StoreReader

__all__ = ["recover_after_reconnect"]

log = logging.getLogger(__name__)


async def recover_after_reconnect(
    owning: Owning,
    owned: OwnedChangeSets,
    reader: StoreReader,
    *,
    check_durability: Callable[[], Awaitable[str | None]],
    sweep_once: Callable[[], Awaitable[object]] | None,
) -> str | None:
    """Recover from a reconnect (see the module's docstring). Returns what is wrong if the server reached now keeps
    acknowledgements below ``require_durability`` (the daemon stops then, and sweeps nothing)."""
    owning.report.stats.nats_reconnects += 1
    # Calls whose answers were lost with the old connection end now: a change set handed back must not wait
    # nats_timeout for one (a delete of a processed request, a record write) before its task goes back.
    owning.nats.requester.fail_lost()
    log.warning("reconnected to NATS: handing back %d owned change sets", len(owned))
    owning.report.stats.reconnect_handbacks += owned.interrupt_all()
    layout = owning.placement.layout
    try:
        # A memory-storage deployment loses streams, consumer and bucket in a restart; elsewhere a no-op.
        await ensure_layout_streams(owning.nats.js, owning.settings, layout)
        await owning.store.open()
        await reader.open()
    except Exception as err:
        log.warning(
            "re-ensuring streams after a reconnect failed (%s); the status page shows what is missing", err
        )
    # The server it came back to may not be the one it left (a failover, a restart with another config).
    floor = await check_durability()
    if floor is not None:
        return floor
    if sweep_once is not None:
        # A release cut short by the outage may have acked its task without its "anything queued?" check.
        with contextlib.suppress(Exception):
            await sweep_once()
    return None
