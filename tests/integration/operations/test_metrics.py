"""``/metrics``: Prometheus text from a real daemon, counters moving as requests are handled, one registry per
daemon (two in one process do not clash)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from nats.aio.client import Client as NatsClient
from prometheus_client.parser import text_string_to_metric_families

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.testing import wait_for
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.changeset.context import Stats
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.ops.daemon_metrics import STATS_METRICS
from rebaser_server.ops.http import DEFAULT_HTTP_PORT, HealthServer
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@asynccontextmanager
async def metrics_url(daemon: Daemon) -> AsyncIterator[str]:
    server = HealthServer(daemon, port=0)
    await server.start()
    try:
        yield f"{server.url}/metrics"
    finally:
        await server.stop()


async def scrape(http: aiohttp.ClientSession, url: str) -> Samples:
    async with http.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = await response.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: list[Samples], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return sum(s.get(key, 0.0) for s in samples)


async def test_counters_move_after_requests(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with (
        running_daemon(nc, settings, SnapshotApp()) as one,
        running_daemon(nc, settings, SnapshotApp()) as two,
        metrics_url(one) as url_one,
        metrics_url(two) as url_two,
        aiohttp.ClientSession() as http,
    ):
        before = [await scrape(http, url_one), await scrape(http, url_two)]
        assert total(before, "rebaser_requests_total", outcome="ok") == 0
        assert total(before, "rebaser_request_processing_seconds_count") == 0

        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        ok = await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=1)], timeout=10)
        assert ok.ok
        conflict = await client.enqueue_updates_with_reply(
            wk, cs, [SetLiteral(path="/a", value=2, expected_version="0" * 26)], timeout=10
        )
        assert conflict.status.kind == "conflicts"

        after = [await scrape(http, url_one), await scrape(http, url_two)]
        assert total(after, "rebaser_requests_total", outcome="ok") == 1
        assert total(after, "rebaser_requests_total", outcome="conflict") == 1
        assert ("rebaser_requests_total", (("outcome", "answered_from_record"),)) in after[0]
        assert total(after, "rebaser_requests_total", outcome="dead_lettered") == 0
        assert total(after, "rebaser_tasks_taken_total") >= 1
        assert total(after, "rebaser_owned_change_sets") == 1
        assert total(after, "rebaser_starting_change_sets") == 0  # its first request answered: started
        assert total(after, "rebaser_request_processing_seconds_count") == 2
        assert total(after, "rebaser_request_queue_wait_seconds_count") == 2
        # Only the owner's registry counted them: the two daemons' numbers are apart.
        owners = [s for s in after if s.get(("rebaser_requests_total", (("outcome", "ok"),)))]
        assert len(owners) == 1
        assert owners[0][("rebaser_requests_waiting", ())] >= 0
        assert owners[0][("rebaser_nats_connected", ())] == 1

        async def released() -> bool:
            now = [await scrape(http, url_one), await scrape(http, url_two)]
            return total(now, "rebaser_task_outcomes_total", outcome="released") >= 1 and (
                total(now, "rebaser_owned_change_sets") == 0
            )

        await wait_for(released, timeout=10, message="the change set released, and counted")


async def test_dead_letters_and_errors_are_counted(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with (
        running_daemon(nc, fast_settings(subject_prefix), RecordingApp()) as daemon,
        metrics_url(daemon) as url,
        aiohttp.ClientSession() as http,
    ):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        reply = await client.enqueue_updates_with_reply(
            wk, cs, [SetLiteral(path="/poison", value=1)], timeout=10
        )
        assert reply.status.kind == "error"

        async def dead_letters() -> Samples | None:
            samples = await scrape(http, url)
            return samples if samples.get(("rebaser_dead_letters", ())) == 1 else None

        samples = await wait_for(dead_letters, timeout=5, message="the dead-letter gauge shows it")
        assert total([samples], "rebaser_requests_total", outcome="dead_lettered") == 1
        assert total([samples], "rebaser_requests_total", outcome="error") == 1


def test_every_counter_of_the_daemon_is_exported() -> None:
    from rebaser_server.ops import daemon_metrics as metrics

    exported = {*STATS_METRICS, *metrics._STATS_ELSEWHERE}
    assert set(Stats().as_dict()) <= exported, set(Stats().as_dict()) - exported


def test_the_default_port_is_not_prometheus_own() -> None:
    assert DEFAULT_HTTP_PORT != 9090
