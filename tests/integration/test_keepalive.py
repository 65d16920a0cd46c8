"""A lease keepalive ends with its change set, even when its cancellation is swallowed.

nats-py's ``request`` awaits ``asyncio.wait_for``, which on Python 3.11 drops a cancellation that arrives as the
answer does. A progress-ack loop that survived that way renewed the lease of a finished processor for ever: the
task was never redelivered and its change set never served again (found by the KV write fault battery, where
every change set ended up stuck this way within seconds). Here the renewal swallows every cancellation, so each
keepalive that relied on being cancelled would survive.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.lease import Lease
from rebaser_server.testing import fast_settings, running_daemon
from tests.apps import RecordingApp


def _keepalives() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("keepalive ")]


async def test_keepalive_ends_with_its_change_set_even_if_a_cancellation_is_swallowed(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Lease.renew
    # Renewals take most of each period, so a cancellation mostly lands in one.
    settings = fast_settings(subject_prefix, progress_period=0.3, quiescent_period=0.2)

    async def renew_swallowing_cancellation(self: Lease, timeout: float) -> bool:
        renewed = await original(self, timeout)
        # What asyncio.wait_for does on Python 3.11 when the answer and the cancellation meet:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(settings.progress_period * 2)
        return renewed

    monkeypatch.setattr(Lease, "renew", renew_swallowing_cancellation)
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        wk = WorkspacePk.new()
        for _ in range(8):
            response = await client.enqueue_updates_with_reply(
                wk, ChangeSetId.new(), [SetLiteral(path="/x", value=1)], timeout=30
            )
            assert response.ok
        # Every change set goes quiet and is released; then no keepalive may be left renewing a lease.
        await wait_for(lambda: daemon.rt.stats.tasks_released >= 8, timeout=30, message="all released")
        await wait_for(
            lambda: not _keepalives(), timeout=10, message="keepalives ended with their change sets"
        )
