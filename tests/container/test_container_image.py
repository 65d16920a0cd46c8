"""The project's image, built from its Dockerfile (on a Debian base made here) and run with podman, checked for
what users rely on: it runs as the unprivileged user; the embedded mode starts, answers ``/healthz`` and its own
HEALTHCHECK, and serves a client on the host; SIGTERM drains within the documented bound, exits 0, and the volume
keeps what was applied for the next container."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.connect import ConnectOptions
from rebaser_core.settings import Settings
from tests.support.podman import Podman

pytestmark = pytest.mark.container

UID = "10001"
# docs/running.md: on SIGTERM the daemon finishes the request in hand within shutdown_grace and hands every owned
# change set back at once. The drain of an idle daemon must fit in it; `podman stop --time` SIGKILLs after it.
GRACE = Settings.model_fields["shutdown_grace"].default


@dataclass
class Embedded:
    podman: Podman
    name: str
    nats_url: str = ""
    http_url: str = ""

    def start(self) -> float:
        """Starts the stopped container; returns the seconds until ``/healthz`` answered on the host."""
        started = time.monotonic()
        self.podman("start", self.name)
        self.nats_url = f"nats://{self._published(4222)}"
        self.http_url = f"http://{self._published(9464)}"
        wait_for_sync(lambda: get_json(f"{self.http_url}/healthz") == {"alive": True}, 60, "no /healthz")
        took = time.monotonic() - started
        # Alive is not yet serving: queries are answered once the daemon says it is ready.
        wait_for_sync(
            lambda: get_json(f"{self.http_url}/readyz") == {"ready": True, "not_ready": []}, 60, "not ready"
        )
        return took

    def _published(self, port: int) -> str:
        published = self.podman("port", self.name, f"{port}/tcp").stdout.split()[0]
        assert published.startswith("127.0.0.1:"), published
        return published


# /status wants the daemon's HTTP token from a peer that is not the container itself (rebaser_server.ops.http).
HTTP_TOKEN = "container-test-token"


def get_json(url: str) -> object:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {HTTP_TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return json.load(response)
    except OSError:
        return None


def wait_for_sync(condition: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.1)  # the next poll of the condition, not a wait that is hoped to be enough


@pytest.fixture(scope="module")
def embedded(podman: Podman, rebaser_image: str, note: Callable[[str], None]) -> Iterator[Embedded]:
    """The image as the README runs it: no REBASER_NATS_URL (the embedded server), its store in a volume, its
    ports published on 127.0.0.1 (free ones)."""
    name = f"rebaser-test-{os.getpid()}-embedded"
    volume = f"{name}-data"
    podman("volume", "create", volume)
    try:
        podman(
            *("create", "--name", name, "--volume", f"{volume}:/var/lib/rebaser"),
            *("--env", f"REBASER_HTTP_TOKEN={HTTP_TOKEN}"),
            *("--publish", "127.0.0.1::4222", "--publish", "127.0.0.1::9464", rebaser_image),
        )
        container = Embedded(podman, name)
        note(f"embedded mode: /healthz answered {container.start():.1f}s after podman start")
        yield container
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)
        podman("volume", "rm", "--force", volume, check=False)


async def request(url: str, wk: WorkspacePk, cs: ChangeSetId, value: int) -> None:
    async with await RebaserClient.connect(ConnectOptions(servers=(url,), name="container-test")) as client:
        reply = await client.enqueue_updates_with_reply(
            wk, cs, [SetLiteral(path="/a", value=value)], timeout=30
        )
        assert reply.ok, reply


async def value_of(url: str, wk: WorkspacePk, cs: ChangeSetId) -> object:
    async with await RebaserClient.connect(ConnectOptions(servers=(url,), name="container-test")) as client:
        return (await client.get_change_set(wk, cs, "/a", timeout=30)).values.get("/a")


def test_the_image_runs_as_the_unprivileged_user(
    podman: Podman, rebaser_image: str, embedded: Embedded
) -> None:
    assert podman.inspect(rebaser_image)["Config"]["User"] == f"{UID}:{UID}"
    # Every process, the embedded nats-server too, as seen from the host (rootful podman maps no ids).
    users = podman("top", embedded.name, "huser", "args").stdout.splitlines()[1:]
    assert users and all(line.split()[0] == UID for line in users), users
    assert any("nats-server" in line for line in users), users
    assert podman("exec", embedded.name, "id", "-u").stdout.strip() == UID
    store = podman("exec", embedded.name, "stat", "-c", "%u", "/var/lib/rebaser/nats").stdout.strip()
    assert store == UID  # the volume's store is the user's own


async def test_the_embedded_mode_answers_healthz_and_serves_the_host(
    podman: Podman, embedded: Embedded
) -> None:
    assert get_json(f"{embedded.http_url}/healthz") == {"alive": True}
    # The image's own HEALTHCHECK (kept by the docker format the build uses), run the way the engine runs it.
    assert podman("healthcheck", "run", embedded.name).returncode == 0
    assert podman.inspect(embedded.name)["State"]["Health"]["Status"] == "healthy"
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    await request(embedded.nats_url, wk, cs, 1)
    assert await value_of(embedded.nats_url, wk, cs) == 1


async def test_sigterm_drains_within_the_documented_bound(
    podman: Podman, embedded: Embedded, note: Callable[[str], None]
) -> None:
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    await request(embedded.nats_url, wk, cs, 7)
    status = get_json(f"{embedded.http_url}/status")
    assert isinstance(status, dict) and status["owned"]["count"] >= 1, (
        status
    )  # there is something to hand back

    started = time.monotonic()
    podman(
        "stop", "--time", str(int(GRACE)), embedded.name, timeout=GRACE + 30
    )  # SIGTERM; SIGKILL after GRACE
    took = time.monotonic() - started
    state = podman.inspect(embedded.name)["State"]
    logs = podman("logs", embedded.name).stderr
    assert state["ExitCode"] == 0, (state, logs[-2000:])  # 137 would be the SIGKILL at the bound
    assert took < GRACE, took
    _, _, after = logs.partition("signal SIGTERM: shutting down")
    assert " stopped" in after and "did not finish handing back" not in after, logs[-2000:]
    note(
        f"embedded mode: SIGTERM to exit 0 in {took:.1f}s (podman stop; bound {GRACE:.0f}s), "
        f"{status['owned']['count']} change sets owned"
    )

    # A new start on the same volume has what was applied.
    embedded.start()
    assert await value_of(embedded.nats_url, wk, cs) == 7
    await request(embedded.nats_url, wk, cs, 8)
    assert await value_of(embedded.nats_url, wk, cs) == 8
