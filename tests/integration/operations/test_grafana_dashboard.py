"""``deploy/grafana-dashboard.json`` cannot rot: every metric its queries name is one a real daemon exports on
``/metrics`` (read from a running daemon after it has handled a request), and it has panels for what operators
watch: the backlog, latency, owned change sets, dead letters, pauses, events, the fair share, retries, DVU failures,
consumer resets and NATS reconnects."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
from nats.aio.client import Client as NatsClient
from prometheus_client.parser import text_string_to_metric_families

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_server.testing import fast_settings, running_daemon
from tests.integration.operations.test_metrics import metrics_url
from tests.support.apps import RecordingApp

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana-dashboard.json"
_METRIC = re.compile(r"\brebaser_[a-z0-9_]+")
# What an operator looks for, each in some panel's query.
_WATCHED = {
    "backlog": "rebaser_requests_waiting",
    "latency": "rebaser_request_queue_wait_seconds_bucket",
    "owned change sets": "rebaser_owned_change_sets",
    "dead letters": "rebaser_dead_letters",
    "pauses": "rebaser_paused",
    "events": "rebaser_events_published_total",
    "fair share": "rebaser_tasks_taken_lately_by_workspace",
    "retries": "rebaser_requests_retried_total",
    "DVU failures": "rebaser_dvu_failures_total",
    "consumer resets": "rebaser_consumer_resets_total",
    "NATS reconnects": "rebaser_nats_reconnects_total",
    "change sets waiting for an owner": "rebaser_tasks_waiting",
}


def _queries(dashboard: dict[str, Any]) -> dict[str, list[str]]:
    """Each panel's title -> its queries (row panels have none); the templating's queries as one more."""
    found: dict[str, list[str]] = {}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        found[panel["title"] + f" (#{panel['id']})"] = [t["expr"] for t in panel.get("targets", [])]
    found["templating"] = [
        v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)
    ]
    return found


async def _exported(nc: NatsClient, prefix: str) -> set[str]:
    """Every metric family and sample name a daemon's /metrics has, once it has applied a request."""
    async with (
        RebaserClient(nc, prefix=prefix) as client,
        running_daemon(nc, fast_settings(prefix, events=True), RecordingApp()) as daemon,
        metrics_url(daemon) as url,
        aiohttp.ClientSession() as http,
    ):
        reply = await client.enqueue_updates_with_reply(
            WorkspacePk.new(), ChangeSetId.new(), [SetLiteral(path="/a", value=1)], timeout=20
        )
        assert reply.ok
        async with http.get(url) as response:
            text = await response.text()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


async def test_every_query_names_a_metric_the_daemon_exports(nc: NatsClient, subject_prefix: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = _queries(dashboard)
    assert all(queries.values()), [title for title, exprs in queries.items() if not exprs]  # no empty panel
    exported = await _exported(nc, subject_prefix)
    # A family's name, or one of its samples' (a counter's _total, a histogram's _bucket, _sum and _count).
    unknown = {
        (title, name)
        for title, exprs in queries.items()
        for expr in exprs
        for name in _METRIC.findall(expr)
        if name not in exported
    }
    assert not unknown, f"the dashboard names metrics no daemon exports: {sorted(unknown)}"
    named = {name for exprs in queries.values() for expr in exprs for name in _METRIC.findall(expr)}
    missing = {what for what, metric in _WATCHED.items() if metric not in named}
    assert not missing, f"no panel shows {sorted(missing)}"


def test_the_queries_are_read_from_every_panel() -> None:
    # The check above is only as good as its reading of the file: a made-up metric in a panel is caught.
    dashboard = json.loads(DASHBOARD.read_text())
    dashboard["panels"][-1]["targets"][0]["expr"] = "rate(rebaser_no_such_metric_total[1m])"
    assert any("rebaser_no_such_metric_total" in e for exprs in _queries(dashboard).values() for e in exprs)
