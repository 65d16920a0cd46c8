"""``rebaser status``: the deployment at a glance, as a table (or ``--json``); the reading is
:mod:`rebaser_client.admin.status`'s."""

from __future__ import annotations

import click

from rebaser_client.admin.cli.common import (
    connection_options,
    console,
    json_option,
    limit_option,
    print_json,
    progress_bar,
    run,
    subjects_of,
)

__all__ = ["status"]


@click.command()
@connection_options
@json_option
@limit_option(50, "Change sets listed (the busiest first).")
@click.option(
    "--nats-monitoring-url",
    "monitoring_urls",
    multiple=True,
    envvar="REBASER_NATS_MONITORING_URLS",
    help="Monitoring endpoint of each NATS server (http://host:8222), to read its sync setting for the durability "
    "line (none: shown as unknown unless the streams are replicated).",
)
@click.option(
    "--daemon-url",
    "daemon_urls",
    multiple=True,
    envvar="REBASER_DAEMON_URLS",
    help="Health endpoint of each daemon (http://host:9464), to read the change sets it owns per workspace (none: "
    "each workspace's owned and waiting change sets are shown as unknown). Sends REBASER_HTTP_TOKEN (or "
    "REBASER_HTTP_TOKEN_FILE's) as the bearer token the daemons' /status wants.",
)
def status(
    nats_url: str,
    prefix: str | None,
    as_json: bool,
    limit: int,
    monitoring_urls: tuple[str, ...],
    daemon_urls: tuple[str, ...],
) -> None:
    """Streams, the tasks consumer, owners, backlogs, the busiest workspaces, dead letters and durability of the
    deployment."""
    subjects = subjects_of(prefix)
    from rebaser_client.admin import format as fmt
    from rebaser_client.admin.status import status_report

    with progress_bar("reading change sets", enabled=not as_json) as progress:
        report = run(
            nats_url,
            lambda nc: status_report(
                nc,
                subjects,
                limit=limit,
                progress=progress,
                monitoring_urls=monitoring_urls,
                daemon_urls=daemon_urls,
            ),
        )
    if as_json:
        print_json(fmt.status_json(report))
    else:
        console().print(fmt.status_view(report))
