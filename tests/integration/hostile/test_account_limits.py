"""What one caller can make the servers hold is bounded (docs/nats-accounts.conf, docs/capacity.md): its account's
connections and subscriptions, and the event consumers a daemon makes for its workspace. Each test floods past the
bound and checks that the flood is refused while another tenant goes on working."""

from __future__ import annotations

import contextlib
import json

import nats
import nats.errors
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient
from rebaser_core.embedded import NatsServer
from rebaser_core.errors import RebaserUnavailable
from rebaser_core.testing import wait_for
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.accounts import (
    CONFINED,
    accounts_server,
    connect_as,
    daemon_nc,
    other_tenant_works,
    request_answered,
)
from tests.support.apps import RecordingApp

__all__ = ["accounts_server", "daemon_nc"]  # fixtures


async def test_a_callers_subscriptions_are_bounded_by_its_account(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    """Past its account's max_subscriptions nats-server drops the connection ("maximum subscriptions exceeded"):
    the flood never holds more than the limit of the server's memory."""
    dropped: list[str] = []

    async def on_disconnect() -> None:
        dropped.append("disconnected")

    caller = await nats.connect(
        accounts_server.url,
        user="workspace-1",
        password="change-me-workspace-1",
        inbox_prefix="_INBOX.workspace-1",
        allow_reconnect=False,
        disconnected_cb=on_disconnect,
    )
    try:
        async with running_daemon(daemon_nc, fast_settings(None), RecordingApp()):
            with contextlib.suppress(nats.errors.Error):
                for n in range(1_100):  # WORKSPACE_1's max_subscriptions is 1,000
                    await caller.subscribe(f"_INBOX.workspace-1.flood.{n}")
                await caller.flush(timeout=5)
            await wait_for(lambda: dropped, message="the connection past the account's limit is dropped")
            assert "maximum subscriptions exceeded" in accounts_server.log_path.read_text()
            await other_tenant_works(accounts_server)
    finally:
        await caller.close()


async def test_a_callers_connections_are_bounded_by_its_account(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    opened: list[NatsClient] = []
    try:
        for _ in range(16):  # FOLLOWER_1's max_connections
            opened.append(await connect_as(accounts_server, "follower-1"))
        refused: Exception | None = None
        try:
            opened.append(
                await nats.connect(
                    accounts_server.url,
                    user="follower-1",
                    password="change-me-follower-1",
                    allow_reconnect=False,
                    max_reconnect_attempts=0,
                    connect_timeout=2,
                )
            )
        except Exception as err:  # nats-py raises what the server said, or gives up
            refused = err
        assert refused is not None, "a 17th connection of the account was accepted"
        async with running_daemon(daemon_nc, fast_settings(None), RecordingApp()):
            await other_tenant_works(accounts_server)
    finally:
        for conn in opened:
            await conn.close()


async def test_a_follower_cannot_have_consumers_made_without_bound(
    accounts_server: NatsServer, daemon_nc: NatsClient
) -> None:
    settings = fast_settings(None, events=True, follow_creates_per_minute=5)
    names = settings.subjects
    caller = await connect_as(accounts_server, "workspace-1")
    try:
        async with running_daemon(daemon_nc, settings, RecordingApp()) as daemon:
            filter_ = names.events_of_workspace(CONFINED)
            answers = []
            for n in range(20):
                config = {
                    "name": f"flood{n}",
                    "filter_subject": filter_,
                    "deliver_subject": f"_INBOX.workspace-1.flood{n}",
                    "deliver_policy": "new",
                    "ack_policy": "none",
                }
                body = json.dumps({"stream_name": names.events_stream, "config": config}).encode()
                subject = (
                    f"{names.follow_api(CONFINED)}.CONSUMER.CREATE.{names.events_stream}.flood{n}.{filter_}"
                )
                answers.append(json.loads((await request_answered(caller, subject, body)).data))
            made = [a for a in answers if "error" not in a]
            refused = [a for a in answers if a.get("error", {}).get("code") == 429]
            assert (len(made), len(refused)) == (5, 15), answers[:6]
            assert "follow_creates_per_minute" in refused[0]["error"]["description"]
            assert daemon.queries.followers.created == 5
            # The client says so as an error it can retry.
            follower = RebaserClient(caller)
            try:
                await follower.watch(CONFINED, since={}).start()
            except RebaserUnavailable:
                pass
            else:
                raise AssertionError("a watch past the limit was made")
            await other_tenant_works(accounts_server)
    finally:
        await caller.close()
