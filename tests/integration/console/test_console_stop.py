"""The console's background loops end when it stops, also when a NATS read swallowed the cancel (Python 3.11's
asyncio.wait_for, which nats-py waits with: rebaser_core.nats.cancellation). The refresh loop took such a lost cancel
for its own wait running out, and outlived stop() (a console test hung for 120 s in CI)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client.admin.console.live import Live
from rebaser_core.subjects import Subjects
from rebaser_core.testing import wait_for


async def test_the_refresh_loop_ends_though_a_read_swallowed_its_cancel(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered = asyncio.Event()

    async def refresh_once(self: Live, overview: bool) -> None:
        if entered.is_set():
            return
        entered.set()
        # What asyncio.wait_for does on Python 3.11 when the answer and the cancellation meet:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()

    monkeypatch.setattr(Live, "refresh_once", refresh_once)
    live = Live(nc, Subjects(subject_prefix), refresh=0.05)
    await live.start()
    refresh = next(task for task in live._tasks if task.get_name() == "console-refresh")
    await asyncio.wait_for(entered.wait(), 5)  # the cancel lands in the read
    stopping = asyncio.ensure_future(live.stop())
    # stop() waits up to 10 s for each loop; the refresh loop must end at its next pass, not be waited out.
    await wait_for(refresh.done, timeout=3, message="the refresh loop ended")
    await stopping
