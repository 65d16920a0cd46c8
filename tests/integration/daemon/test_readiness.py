"""A daemon is not ready (``/readyz``) until its set-up is done: started again on the streams of an earlier run,
every JetStream fact looked fine while its app and query service were still starting, and a client that trusted
``/readyz`` got "no daemon answers get queries" (found by the container image's restart test)."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsClient

from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.testing import fast_settings
from tests.support.apps import RecordingApp


class SlowToStart(RecordingApp):
    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.go_on = asyncio.Event()

    async def start(self, nc: NatsClient, settings: Settings) -> None:
        self.started.set()
        await self.go_on.wait()


async def test_not_ready_until_the_set_up_is_done(nc: NatsClient, subject_prefix: str) -> None:
    app = SlowToStart()
    daemon = Daemon(nc, fast_settings(subject_prefix), app)
    starting = asyncio.create_task(daemon.start(timeout=30))
    try:
        await wait_for(
            app.started.is_set, timeout=20, message="the app's start begun"
        )  # the streams are there
        status = await daemon.status()
        assert not status["ready"] and any(r.startswith("starting") for r in status["not_ready"]), status
        app.go_on.set()
        await starting
        await wait_for(lambda: daemon.serving, timeout=5, message="serving")
        status = await daemon.status()
        assert status["ready"], status["not_ready"]
    finally:
        app.go_on.set()
        await starting
        await daemon.shutdown()
