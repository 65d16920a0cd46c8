"""The example account configuration (docs/nats-accounts.conf) on a real nats-server: a caller with those
permissions gets its work done, and cannot reach the daemons' records, snapshots, streams or other inboxes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.embedded import NatsServer
from rebaser_core.errors import RebaserRefused
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp

CONF = Path(__file__).parents[3] / "docs" / "nats-accounts.conf"


@pytest.fixture
def accounts_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(store_dir=tmp_path / "nats", extra_args=["-c", str(CONF)])
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


async def test_caller_permissions(accounts_server: NatsServer, daemon_nc: NatsClient) -> None:
    errors: list[str] = []

    async def on_error(err: Exception) -> None:
        errors.append(str(err))

    caller = await nats.connect(
        accounts_server.url,
        user="client-1",
        password="change-me-client-1",
        inbox_prefix="_INBOX.client-1",
        error_cb=on_error,
    )
    settings = fast_settings(None)
    try:
        async with (
            running_daemon(daemon_nc, settings, RecordingApp()) as daemon,
            RebaserClient(caller) as client,
        ):
            wk, cs = WorkspacePk.new(), ChangeSetId.new()
            assert (
                await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=1)], timeout=20)
            ).ok
            # Reading the shard layout is allowed (one direct get), and nothing else the client did was refused.
            assert not [e for e in errors if "permissions violation" in e.lower()]
            with pytest.raises(RebaserRefused, match="cannot describe"):  # a query is answered
                await client.get_change_set(wk, cs)
            key = settings.subjects.change_set_key(wk, cs)
            before = await daemon.store.kv.get(key)
            forbidden = [
                f"$KV.{settings.subjects.change_sets_bucket}.{key}",
                f"$O.{settings.subjects.snapshots_bucket}.M.abc",
                f"$JS.API.STREAM.DELETE.{settings.subjects.requests_stream}",
                # The layout's direct get is allowed; another bucket's is not.
                f"$JS.API.DIRECT.GET.KV_{settings.subjects.change_sets_bucket}",
                f"dlq.rebaser.requests.{wk}.{cs}",
                "_INBOX.someone-else.x",
            ]
            for subject in forbidden:
                await caller.publish(subject, b"forged")
            await caller.subscribe("_INBOX.>")  # other callers' replies, the daemons' deliveries
            await caller.flush()
            await wait_for(
                lambda: sum("permissions violation" in e.lower() for e in errors) >= len(forbidden) + 1,
                message=f"every forbidden publish and the subscription refused: {errors}",
            )
            after = await daemon.store.kv.get(key)
            assert after.revision == before.revision and after.value == before.value
            assert (await daemon_nc.jetstream().stream_info(settings.subjects.requests_stream)).config.name
            # And the caller still works after all that.
            assert (
                await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/n", value=2)], timeout=20)
            ).ok
    finally:
        await caller.close()


async def test_status_shows_no_credentials(accounts_server: NatsServer) -> None:
    url = f"nats://rebaser-daemon:change-me-daemon@127.0.0.1:{accounts_server.port}"
    conn = await nats.connect(url)
    try:
        async with running_daemon(conn, fast_settings(None), RecordingApp()) as daemon:
            status = json.dumps(await daemon.status())
            assert "change-me-daemon" not in status and "rebaser-daemon" not in status
            assert f"***@127.0.0.1:{accounts_server.port}" in status
    finally:
        await conn.close()


async def test_connect_failure_shows_no_credentials(accounts_server: NatsServer) -> None:
    from rebaser_core.connect import ConnectOptions
    from rebaser_core.errors import RebaserUnavailable

    url = f"nats://client-1:wrong-password@127.0.0.1:{accounts_server.port}"
    with pytest.raises(RebaserUnavailable) as raised:
        await RebaserClient.connect(
            ConnectOptions(servers=(url,), connect_timeout=1.0, extra={"max_reconnect_attempts": 0})
        )
    assert "wrong-password" not in str(raised.value) and "***@127.0.0.1" in str(raised.value)
