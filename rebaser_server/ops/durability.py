"""Checking, not trusting, what the NATS servers and streams promise for an acknowledged request.

At start-up and after every reconnect the daemon reads each server's sync setting from its monitoring endpoint
(``Settings.nats_monitoring_urls``: ``/varz`` has ``sync_always`` and ``sync_interval``) and the replicas of every
stream that holds acknowledged data, and works out the durability (:func:`rebaser_core.nats.durability.assess`). The
result is on ``/status`` (``durability``), in ``/metrics`` (``rebaser_durability``), and noted in the layout bucket
(rebaser_core.nats.layout_store) for ``rebaser status``, which cannot read the monitoring endpoints when it is not given
them.
When acknowledgements would not survive a power loss it logs one warning line (again only when that changes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import Any

from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from rebaser_core.nats.durability import Durability, assess
from rebaser_core.nats.layout_store import open_layout, write_durability
from rebaser_core.nats.monitoring import read_servers_sync
from rebaser_core.settings import Settings

__all__ = ["DurabilityCheck", "durable_streams"]

log = logging.getLogger(__name__)


class DurabilityCheck:
    """Reads the servers' sync setting and the streams' replicas; keeps the last result (``last``)."""

    def __init__(self, js: JetStreamContext, settings: Settings, *, owner: str = "") -> None:
        self._js = js
        self._settings = settings
        self._owner = owner
        self._urls = settings.nats_monitoring_urls
        self.last: Durability | None = None
        self._warned: str | None = None

    async def check(self, streams: Sequence[str]) -> Durability:
        """Read everything again; log the warning line when it is new. Never raises for what it cannot read: that
        becomes a problem in the result."""
        # Blocking reads of a few KiB each (all at once), off the event loop.
        servers, problems = await asyncio.to_thread(read_servers_sync, self._urls)
        replicas, stream_problems = await self._read_replicas(streams)
        result = assess(
            servers, replicas, expected_servers=len(self._urls), problems=problems + stream_problems
        )
        self.last = result
        warning = result.warning()
        if warning is not None and warning != self._warned:
            log.warning("%s", warning)
        elif warning is None:
            log.info("durability: %s (sync %s, replicas %s)", result.level, result.sync, result.min_replicas)
        self._warned = warning
        await self._note(result)
        return result

    async def _note(self, result: Durability) -> None:
        """Write the finding beside the layout (best effort: a daemon that cannot serves all the same)."""
        try:
            kv = await open_layout(self._js, self._settings.subjects)
            if kv is not None:
                await write_durability(kv, result, self._owner)
        except Exception as err:
            log.debug("noting the durability failed: %r", err)

    async def _read_replicas(self, streams: Sequence[str]) -> tuple[dict[str, int], list[str]]:
        calls: list[Awaitable[Any]] = [self._js.stream_info(name) for name in streams]
        results = await asyncio.gather(*calls, return_exceptions=True)
        replicas: dict[str, int] = {}
        problems = []
        for name, info in zip(streams, results, strict=True):
            if isinstance(info, NotFoundError):
                continue  # not created (the first layout's batches, on a deployment that never had them): holds nothing
            if isinstance(info, BaseException):
                problems.append(f"stream {name}: {type(info).__name__} {info}".strip())
                continue
            replicas[name] = int(info.config.num_replicas or 1)
        return replicas, problems


def durable_streams(settings: Settings, shards: Sequence[int]) -> list[str]:
    """The streams that hold acknowledged data: every served shard's requests and tasks, the dead letters, the
    change-set records, the shard layout and the stored batches."""
    subjects = settings.subjects
    names = []
    for shard in shards:
        names += [subjects.for_shard(shard).requests_stream, subjects.for_shard(shard).tasks_stream]
    names.append(subjects.dead_letter_stream)
    names += [
        f"KV_{subjects.change_sets_bucket}",
        f"KV_{subjects.layout_bucket}",
        subjects.stored_batches_stream,
        f"OBJ_{subjects.batches_bucket}",  # the first layout's, where a deployment still has it
    ]
    return names
