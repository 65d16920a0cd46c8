"""The client's typed errors, the sync wrapper and the CLI, against a real server."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from click.testing import CliRunner
from nats.aio.client import Client as NatsClient

from rebaser_client import (
    ChangeSetId,
    InvalidId,
    RebaserClient,
    RebaserTimeout,
    RebaserUnavailable,
    SetLiteral,
    SyncRebaserClient,
    WorkspacePk,
)
from rebaser_client.admin.cli.main import main as cli
from rebaser_core.nats.streams import ensure_streams
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.testing import fast_settings, running_daemon


async def test_no_streams_means_unavailable(client: RebaserClient) -> None:
    with pytest.raises(RebaserUnavailable):
        await client.enqueue_updates(WorkspacePk.new(), ChangeSetId.new(), [])


async def test_unreachable_server_means_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    with pytest.raises(RebaserUnavailable):
        await RebaserClient.connect(f"nats://127.0.0.1:{port}")


async def test_no_daemon_means_timeout_but_request_is_durable(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = Settings(prefix=subject_prefix, storage="memory")
    await ensure_streams(nc.jetstream(), settings)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    with pytest.raises(RebaserTimeout):
        await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=1)], timeout=0.5)
    info = await nc.jetstream().stream_info(settings.subjects.requests_stream)
    assert info.state.messages == 1  # still queued: a daemon that starts later applies it


async def test_ids_may_be_given_as_text_and_anything_else_is_an_invalid_id(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = Settings(prefix=subject_prefix, storage="memory")
    await ensure_streams(nc.jetstream(), settings)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    rid = await client.enqueue_updates(str(wk), str(cs).lower(), [SetLiteral(path="/a", value=1)])
    stored = await nc.jetstream().get_last_msg(
        settings.subjects.requests_stream, settings.subjects.requests(wk, cs)
    )
    assert stored.headers is not None and stored.headers["Nats-Msg-Id"] == str(rid)

    other = ChangeSetId.new()
    refused = [
        ("workspace_id", client.enqueue_updates("01J-not-an-id", str(cs), [])),
        ("change_set_id", client.enqueue_updates_with_reply(wk, str(wk)[:-1], [], timeout=1)),
        ("change_set_id", client.enqueue_updates(wk, wk, [])),  # type: ignore[arg-type]  # a WorkspacePk
        ("from_change_set_id", client.enqueue_updates_from_change_set(wk, cs, "nope")),
        ("from_change_set_id", client.enqueue_updates_from_change_set_with_reply(wk, cs, "nope", timeout=1)),
        ("workspace_id", client.get_change_set("nope", cs)),
        ("from_change_set_id", client.fork_change_set(wk, other, "nope")),
        ("change_set_id", client.wait_settled(wk, "nope", timeout=1)),
    ]
    for argument, call in refused:
        with pytest.raises(InvalidId, match=f"^{argument}: "):
            await call
    info = await nc.jetstream().stream_info(settings.subjects.requests_stream)
    assert info.state.messages == 1  # nothing else was sent


async def test_sync_client_and_cli(nc: NatsClient, nats_url: str, subject_prefix: str) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), SnapshotApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()

        def sync_call() -> bool:
            with SyncRebaserClient(nats_url, prefix=subject_prefix) as sync_client:
                return sync_client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=2)]).ok

        assert await asyncio.to_thread(sync_call)

        runner = CliRunner()
        base = [
            "--nats-url",
            nats_url,
            "--prefix",
            subject_prefix,
            "--workspace",
            str(wk),
            "--change-set",
            str(cs),
        ]
        result = await asyncio.to_thread(
            runner.invoke, cli, ["request", *base, "--set", "/b=3", "--function", "/c=sum(/a,/b)"]
        )
        assert result.exit_code == 0, result.output
        status = json.loads(result.output)["status"]
        assert status["kind"] == "success" and status["updates_performed"] == 2
        result = await asyncio.to_thread(runner.invoke, cli, ["enqueue", *base, "--remove", "/b"])
        assert result.exit_code == 0 and len(result.output.strip()) == 26, result.output

        async def computed() -> bool:
            got = await asyncio.to_thread(runner.invoke, cli, ["get", *base, "--path", "/c"])
            return got.exit_code == 0 and json.loads(got.output)["values"] == {"/c": 2}

        await wait_for(computed, timeout=10, message="rebaser get shows /c = sum(/a) once /b is removed")
        result = await asyncio.to_thread(runner.invoke, cli, ["request", *base, "--set", "no-equals-sign"])
        assert result.exit_code == 2 and "PATH=JSON" in result.output
        result = await asyncio.to_thread(
            runner.invoke, cli, ["request", *base[:-1], "not-a-ulid", "--set", "/a=1"]
        )
        assert result.exit_code != 0 and "ULID" in result.output
