"""The reference account configuration (docs/nats-accounts.conf) on a real nats-server, and connections as its users.

Import the fixtures into a test module (``from tests.support.accounts import accounts_server, daemon_nc``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for

CONF = Path(__file__).parents[2] / "docs" / "nats-accounts.conf"
# The workspace the users workspace-1 and follower-1 of that configuration are confined to.
CONFINED = WorkspacePk("01HZZZZZZZZZZZZZZZZZZZZZZW")
# The callers of the configuration, each in an account of its own.
CALLERS = ("client-1", "workspace-1", "follower-1")


@pytest.fixture
def accounts_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(store_dir=tmp_path / "nats", include=CONF)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def daemon_nc(accounts_server: NatsServer) -> AsyncIterator[NatsClient]:
    conn = await nats.connect(accounts_server.url, user="rebaser-daemon", password="change-me-daemon")
    yield conn
    await conn.close()


async def connect_as(
    server: NatsServer, user: str, errors: list[str] | None = None, *, password: str | None = None
) -> NatsClient:
    """A connection as ``user`` of the configuration (password ``change-me-<user>`` unless given, inbox prefix
    ``_INBOX.<user>``), each asynchronous error it gets appended to ``errors`` (lower case, as nats-py reports the
    server's -ERR)."""

    async def on_error(err: Exception) -> None:
        if errors is not None:
            errors.append(str(err).lower())

    return await nats.connect(
        server.url,
        user=user,
        password=password or f"change-me-{user}",
        inbox_prefix=f"_INBOX.{user}",
        error_cb=on_error,
    )


async def other_tenant_works(server: NatsServer) -> None:
    """A request of ``client-1``, in a workspace of its own, is applied: another tenant is served."""
    other = await connect_as(server, "client-1")
    try:
        async with RebaserClient(other) as client:
            updates = [SetLiteral(path="/n", value=1)]
            reply = await client.enqueue_updates_with_reply(
                WorkspacePk.new(), ChangeSetId.new(), updates, timeout=20
            )
            assert reply.ok, reply
    finally:
        await other.close()


async def request_answered(
    conn: NatsClient,
    subject: str,
    body: bytes,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
) -> Msg:
    """``conn``'s request, asked again while nats-server says "no responders" (for up to ``timeout``).

    A caller's first request through an import, right after the daemon started and its subscription was confirmed
    (a flush), got "no responders" twice in CI (the follower API and the request gate; not reproduced in 12 runs
    beside CPU hogs; the daemon's connection had not reconnected). No daemon received it, so nothing is counted or
    stored for it: asking again changes nothing a test checks. The client does the same (RebaserUnavailable, which it
    retries)."""
    answer: list[Msg] = []

    async def answered() -> bool:
        try:
            answer.append(await conn.request(subject, body, headers=headers, timeout=timeout))
        except nats.errors.NoRespondersError:
            return False
        return True

    await wait_for(answered, timeout=timeout, message=f"no responders for {subject} for {timeout:g} s")
    return answer[0]
