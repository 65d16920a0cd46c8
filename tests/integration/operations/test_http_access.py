"""/status and /metrics name workspaces: over real HTTP, they answer operators only (a bearer token, or this host
when no token is set), while /healthz and /readyz stay open to every prober (rebaser_server.ops.http)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client.admin.workspaces import read_daemons_owned
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.ops.http import HealthServer, is_loopback
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp

TOKEN = "s3cret-operators-only"


def _outside_address() -> str:
    """An address of this host that is not loopback: a peer connecting to it is "another host" to the server."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
        address = str(probe.getsockname()[0])
    if is_loopback(address):
        pytest.skip("this host has no address but loopback")
    return address


@asynccontextmanager
async def served(daemon: Daemon, host: str, token: str | None) -> AsyncIterator[int]:
    server = HealthServer(daemon, host=host, port=0, token=token)
    await server.start()
    try:
        yield server.port
    finally:
        await server.stop()


async def _status_of(http: aiohttp.ClientSession, url: str, token: str | None = None) -> int:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with http.get(url, headers=headers) as response:
        await response.read()
        return response.status


async def test_with_a_token_status_and_metrics_want_it_and_the_probes_stay_open(
    nc: NatsClient, subject_prefix: str
) -> None:
    outside = _outside_address()
    async with (
        running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon,
        served(daemon, "0.0.0.0", TOKEN) as port,
        aiohttp.ClientSession() as http,
    ):
        for host in (outside, "127.0.0.1"):  # a token, when set, is wanted from this host too
            base = f"http://{host}:{port}"
            assert await _status_of(http, f"{base}/healthz") == 200
            assert await _status_of(http, f"{base}/readyz") == 200
            for path in ("/status", "/metrics"):
                assert await _status_of(http, f"{base}{path}") == 401, (host, path)
                assert await _status_of(http, f"{base}{path}", "wrong") == 401, (host, path)
                assert await _status_of(http, f"{base}{path}", TOKEN) == 200, (host, path)
        async with http.get(f"http://{outside}:{port}/status") as response:
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
            assert "owned" not in await response.text()  # nothing of /status's own answer


async def test_without_a_token_an_exposed_endpoint_keeps_status_and_metrics_to_this_host(
    nc: NatsClient, subject_prefix: str
) -> None:
    """The container image binds 0.0.0.0: with no token, another host gets 403, never the workspaces' names."""
    outside = _outside_address()
    async with (
        running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon,
        served(daemon, "0.0.0.0", None) as port,
        aiohttp.ClientSession() as http,
    ):
        base = f"http://{outside}:{port}"
        assert await _status_of(http, f"{base}/healthz") == 200
        assert await _status_of(http, f"{base}/readyz") == 200
        for path in ("/status", "/metrics"):
            assert await _status_of(http, f"{base}{path}") == 403, path
            assert await _status_of(http, f"http://127.0.0.1:{port}{path}") == 200, path
        async with http.get(f"{base}/status") as response:
            body = await response.json()
            assert "--http-token" in body["error"] and "owned" not in body


async def test_bound_to_loopback_without_a_token_everything_answers(
    nc: NatsClient, subject_prefix: str
) -> None:
    """The default: only this host can connect, so nothing more is asked."""
    async with (
        running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon,
        served(daemon, "127.0.0.1", None) as port,
        aiohttp.ClientSession() as http,
    ):
        for path in ("/healthz", "/readyz", "/status", "/metrics"):
            assert await _status_of(http, f"http://127.0.0.1:{port}{path}") == 200, path


async def test_rebaser_status_sends_the_token_it_is_given(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``rebaser status --daemon-url`` reads /status with the token of REBASER_HTTP_TOKEN(_FILE), as the daemon."""
    async with (
        running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon,
        served(daemon, "127.0.0.1", TOKEN) as port,
    ):
        url = f"http://127.0.0.1:{port}"
        monkeypatch.delenv("REBASER_HTTP_TOKEN", raising=False)
        monkeypatch.delenv("REBASER_HTTP_TOKEN_FILE", raising=False)
        unread = await asyncio.to_thread(read_daemons_owned, [url])
        assert unread.read == 0 and "401" in unread.problems[0], unread
        secret = tmp_path / "token"
        secret.write_text(f"{TOKEN}\n")
        monkeypatch.setenv("REBASER_HTTP_TOKEN_FILE", str(secret))
        read = await asyncio.to_thread(read_daemons_owned, [url])
        assert read.read == 1 and not read.problems, read


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        HealthServer(None, token=" ")  # type: ignore[arg-type]
