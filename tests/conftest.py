from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient
from rebaser_core.embedded import NatsServer

pytest_plugins = ["rebaser_core.testing"]


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NatsClient]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


@pytest.fixture
async def client(nc: NatsClient, subject_prefix: str) -> AsyncIterator[RebaserClient]:
    async with RebaserClient(nc, prefix=subject_prefix) as c:
        yield c


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A server of the test's own (file store in tmp_path), for tests that stop and restart NATS."""
    server = NatsServer(store_dir=tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()
