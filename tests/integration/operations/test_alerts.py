"""``deploy/alerts.yml`` cannot rot: it is a Prometheus rule file (groups of rules, each with an expression, a
severity and a summary), Prometheus loads it (``rule_files`` of ``deploy/prometheus.yml``, the file mounted there by
``docker-compose.yml``), every metric its expressions name is one a real daemon exports on ``/metrics`` (read from a
running daemon, as the dashboard's test does), and it alerts on what operators must hear of."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from nats.aio.client import Client as NatsClient

from tests.integration.operations.test_grafana_dashboard import _exported
from tests.unit.project.test_deploy import compose_config

ROOT = Path(__file__).resolve().parents[3]
ALERTS = ROOT / "deploy" / "alerts.yml"
_METRIC = re.compile(r"\brebaser_[a-z0-9_]+")
# What an operator must be told of, each by some rule's expression.
_ALERTED = {
    "daemon down": "up{",
    "NATS disconnected": "rebaser_nats_connected",
    "not ready": "rebaser_backlog_stale",
    "backlog growing": "rebaser_requests_waiting",
    "dead letters rising": 'rebaser_requests_total{outcome="dead_lettered"}',
    "retries": "rebaser_requests_retried_total",
    "DVU failures": "rebaser_dvu_failures_total",
    "consumer resets": "rebaser_consumer_resets_total",
    "NATS reconnects": "rebaser_nats_reconnects_total",
    "change sets waiting with no owner": "rebaser_tasks_waiting",
    "the durability finding": "rebaser_durability{",
}
TESTS = ROOT / "deploy" / "alerts.test.yml"
_FIRING = re.compile(r'alertname="(\w+)", alertstate="firing"')


def _rules(document: Any) -> list[dict[str, Any]]:
    assert isinstance(document, dict) and isinstance(document.get("groups"), list), (
        "not a Prometheus rule file"
    )
    rules = [rule for group in document["groups"] for rule in group["rules"]]
    assert rules, "no rule"
    return rules


def test_the_rules_are_well_formed_and_alert_on_what_matters() -> None:
    rules = _rules(yaml.safe_load(ALERTS.read_text()))
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), names
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in ("critical", "warning"), rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s")), rule
    exprs = " ".join(rule["expr"] for rule in rules)
    missing = {what for what, needle in _ALERTED.items() if needle not in exprs}
    assert not missing, f"no rule alerts on {sorted(missing)}"


def test_every_alert_is_shown_firing_by_the_promtool_tests() -> None:
    # promtool runs deploy/alerts.test.yml in the container tests (tests/container/test_alert_rules.py); here, that
    # it tests every alert the rule file has, and that it is a promtool test file of that rule file.
    tests = yaml.safe_load(TESTS.read_text())
    assert tests["rule_files"] == [ALERTS.name], tests["rule_files"]
    fired = {
        name
        for group in tests["tests"]
        for case in group["promql_expr_test"]
        for sample in case["exp_samples"]
        for name in _FIRING.findall(sample["labels"])
    }
    alerts = {rule["alert"] for rule in _rules(yaml.safe_load(ALERTS.read_text()))}
    assert alerts - fired == set(), f"alerts no promtool test shows firing: {sorted(alerts - fired)}"
    assert fired <= alerts, f"tests of alerts the rule file does not have: {sorted(fired - alerts)}"


def test_prometheus_loads_the_rules_compose_mounts() -> None:
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    (rule_file,) = prometheus["rule_files"]
    service = compose_config()["services"]["prometheus"]
    mounted = {v["target"]: v["source"] for v in service["volumes"]}
    assert mounted.get(rule_file) == str(ALERTS), (rule_file, mounted)


async def test_every_rule_names_a_metric_the_daemon_exports(nc: NatsClient, subject_prefix: str) -> None:
    rules = _rules(yaml.safe_load(ALERTS.read_text()))
    exported = await _exported(nc, subject_prefix)
    unknown = {
        (rule["alert"], name)
        for rule in rules
        for name in _METRIC.findall(rule["expr"])
        if name not in exported
    }
    assert not unknown, f"the alert rules name metrics no daemon exports: {sorted(unknown)}"


def test_a_made_up_metric_is_caught() -> None:
    # The check above is only as good as its reading of the file: a made-up metric in a rule is found.
    document = yaml.safe_load(ALERTS.read_text())
    document["groups"][0]["rules"][-1]["expr"] = "rate(rebaser_no_such_metric_total[1m]) > 0"
    assert "rebaser_no_such_metric_total" in {
        name for rule in _rules(document) for name in _METRIC.findall(rule["expr"])
    }
