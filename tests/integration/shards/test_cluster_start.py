"""Three daemons starting at once against a fresh 3-node cluster (R3 streams): every one of them comes up.

nats-server leaves the losing concurrent stream creates unanswered, so a daemon that treated the timeout as fatal
would exit; the set-up is retried instead, the app's start (which may open stores of its own) included."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import APIError

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.embedded import NatsCluster
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.testing import fast_settings
from tests.support.apps import RecordingApp


async def test_three_daemons_start_at_once_on_a_fresh_cluster(subject_prefix: str, tmp_path: Path) -> None:
    cluster = NatsCluster(3, base_dir=tmp_path)  # its own, brand new: nothing created on it yet
    await asyncio.to_thread(cluster.start)
    try:
        await _start_three(cluster, subject_prefix)
    finally:
        await asyncio.to_thread(cluster.stop)


async def _start_three(cluster: NatsCluster, subject_prefix: str) -> None:
    settings = fast_settings(subject_prefix, replicas=3, storage="file")
    conns = [await nats.connect(servers=[url]) for url in cluster.urls]
    daemons = [Daemon(nc, settings, RecordingApp()) for nc in conns]
    try:
        async with asyncio.timeout(60):
            await asyncio.gather(*(d.start(timeout=45) for d in daemons))
        async with RebaserClient(conns[0], prefix=subject_prefix) as client:
            response = await client.enqueue_updates_with_reply(
                WorkspacePk.new(), ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=20
            )
            assert response.ok
    finally:
        async with asyncio.timeout(60):
            await asyncio.gather(*(d.shutdown() for d in daemons))
        for nc in conns:
            with contextlib.suppress(Exception):
                await nc.close()


class _StartingApp(RecordingApp):
    """An app whose starts fail with ``failures`` in turn, then succeed; it records its starts and stops."""

    def __init__(self, *failures: Exception) -> None:
        super().__init__()
        self.calls: list[str] = []
        self._failures = list(failures)

    async def start(self, nc: NatsClient, settings: Settings) -> None:
        self.calls.append("start")
        if self._failures:
            raise self._failures.pop(0)

    async def stop(self) -> None:
        self.calls.append("stop")


async def test_an_app_start_that_times_out_is_retried_after_a_stop(
    nc: NatsClient, subject_prefix: str
) -> None:
    # Its store is not answering yet: the first two starts time out, as a JetStream call does while a stream leader
    # is elected.
    app = _StartingApp(nats.errors.TimeoutError(), nats.errors.TimeoutError())
    daemon = Daemon(nc, fast_settings(subject_prefix), app)
    try:
        async with asyncio.timeout(30):
            await daemon.start(timeout=20)
        assert app.calls == ["start", "stop", "start", "stop", "start"]  # each failed start released first
        async with RebaserClient(nc, prefix=subject_prefix) as client:
            response = await client.enqueue_updates_with_reply(
                WorkspacePk.new(), ChangeSetId.new(), [SetLiteral(path="/n", value=1)], timeout=20
            )
            assert response.ok
    finally:
        await daemon.shutdown()


async def test_an_app_start_refused_for_good_ends_the_start_at_once(
    nc: NatsClient, subject_prefix: str
) -> None:
    # Its store refuses its configuration: no retry can change that.
    app = _StartingApp(
        APIError(code=400, err_code=10058, description="stream name already in use with a different config")
    )
    daemon = Daemon(nc, fast_settings(subject_prefix), app)
    try:
        with pytest.raises(APIError, match="different config"):
            async with asyncio.timeout(30):
                await daemon.start()  # no deadline: a refusal retried would never end
        assert app.calls == ["start", "stop"]
    finally:
        await daemon.shutdown()
