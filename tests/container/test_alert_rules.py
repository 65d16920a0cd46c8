"""deploy/alerts.yml checked and tested by Prometheus's own promtool (the Debian package's, in the compose test's
Prometheus image): ``promtool check rules`` reads every rule as Prometheus would, and ``promtool test rules`` runs
deploy/alerts.test.yml, which shows each alert firing on made-up series and quiet where it must be. That every
alert has a test there is checked without containers (tests/integration/operations/test_alerts.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.podman import HERE, ROOT, Podman, cached_image

pytestmark = pytest.mark.container


@pytest.fixture(scope="module")
def prometheus(podman: Podman, base: str) -> str:
    return cached_image(
        podman, "localhost/rebaser-test-prometheus", HERE / "prometheus.Containerfile", {"BASE_IMAGE": base}
    )


def promtool(podman: Podman, image: str, *args: str, rules: Path = ROOT / "deploy") -> tuple[bool, str]:
    """``promtool ARGS`` with ``rules`` mounted read-only at /rules: whether it succeeded, and its output."""
    result = podman(
        *("run", "--rm", "--network", "none", "--user", "root"),
        *("--volume", f"{rules}:/rules:ro", "--entrypoint", "/usr/bin/promtool", image, *args),
        check=False,
    )
    return result.returncode == 0, result.stdout + result.stderr


def test_promtool_checks_the_rules(podman: Podman, prometheus: str) -> None:
    document = yaml.safe_load((ROOT / "deploy" / "alerts.yml").read_text())
    count = sum(len(group["rules"]) for group in document["groups"])
    ok, output = promtool(podman, prometheus, "check", "rules", "/rules/alerts.yml")
    assert ok and f"SUCCESS: {count} rules found" in output, output


def test_promtool_runs_the_rules_tests(podman: Podman, prometheus: str) -> None:
    ok, output = promtool(podman, prometheus, "test", "rules", "/rules/alerts.test.yml")
    assert ok and "SUCCESS" in output and "FAILED" not in output, output


def test_the_rules_tests_catch_a_wrong_threshold(podman: Podman, prometheus: str, tmp_path: Path) -> None:
    # The tests above are only as good as what they expect: with a reconnect threshold ten times too high, the
    # alert they show firing stays quiet, and promtool says so.
    shutil.copy(ROOT / "deploy" / "alerts.test.yml", tmp_path)
    rules = (ROOT / "deploy" / "alerts.yml").read_text()
    wrong = rules.replace("[15m])) > 3", "[15m])) > 30")
    assert wrong != rules
    (tmp_path / "alerts.yml").write_text(wrong)
    tmp_path.chmod(0o755)
    ok, output = promtool(podman, prometheus, "test", "rules", "/rules/alerts.test.yml", rules=tmp_path)
    assert not ok and "RebaserNatsReconnects" in output, output
