from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient

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
