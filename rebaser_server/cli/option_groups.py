"""The flags of ``rebaser-server`` that come in groups: the NATS connection, the embedded nats-server and the
health endpoint, each group one decorator, with the checks of its values.

A group's options are listed in ``--help`` in the order given here, where :mod:`~rebaser_server.cli.main` puts the
group among its other flags. Only ``click`` and light modules are imported: ``--help`` and ``--version`` load
neither the daemon nor nats-py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from rebaser_core.errors import InvalidUrl
from rebaser_core.nats.connect import check_server_url
from rebaser_server.daemon.config import DEFAULT_EMBEDDED_HOST, DEFAULT_EMBEDDED_PORT, ServerConfig

__all__ = ["embedded_server_options", "health_endpoint_options", "http_token_from", "nats_connection_options"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _group(*options: Callable[[_F], _F]) -> Callable[[_F], _F]:
    """``options`` (click's option decorators) as one decorator, listed in ``--help`` in the order given."""

    def decorate(command: _F) -> _F:
        # The last one given is applied first, as stacked decorators are: click lists them from the top down.
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def _check_sync(ctx: click.Context, param: click.Parameter, value: str) -> str | None:
    # Imported when called: rebaser_server.devtools is not loaded for --help or --version.
    from rebaser_server.devtools.embedded_start import sync_option

    return sync_option(ctx, param, value)


def http_token_from(token: str | None, token_file: Path | None) -> str | None:
    """The health endpoint's token, given itself or in a file (its first line); not both, never empty."""
    if token is not None and token_file is not None:
        raise click.UsageError("give --http-token or --http-token-file, not both")
    if token_file is not None:
        lines = token_file.read_text(encoding="utf-8").strip().splitlines()
        token = lines[0].strip() if lines else ""
        if not token:
            raise click.UsageError(f"--http-token-file {token_file} is empty")
        return token
    if token is not None and not token.strip():
        raise click.UsageError("--http-token is empty")
    return None if token is None else token.strip()


def _check_nats_urls(ctx: click.Context, param: click.Parameter, urls: tuple[str, ...]) -> tuple[str, ...]:
    """A URL nats-py cannot use (``http://...``) is refused here, naming the schemes, not later as a failed name
    lookup of ``http``."""
    for url in urls:
        try:
            check_server_url(url)
        except InvalidUrl as err:
            raise click.BadParameter(str(err), ctx=ctx, param=param) from None
    return urls


# How rebaser-server reaches NATS (none of them: it runs an embedded server).
nats_connection_options = _group(
    click.option(
        "--nats-url",
        "nats_urls",
        multiple=True,
        envvar="REBASER_NATS_URL",
        show_envvar=True,
        callback=_check_nats_urls,
        help="NATS server URL (repeatable; in the variable, separated by spaces). None: run an embedded server.",
    ),
    click.option("--user", envvar="REBASER_NATS_USER", show_envvar=True, help="NATS user name."),
    click.option("--password", envvar="REBASER_NATS_PASSWORD", show_envvar=True, help="NATS password."),
    click.option("--token", envvar="REBASER_NATS_TOKEN", show_envvar=True, help="NATS authentication token."),
    click.option(
        "--nkey-seed", envvar="REBASER_NATS_NKEY_SEED", show_envvar=True, help="Path to an nkey seed file."
    ),
    click.option(
        "--creds", envvar="REBASER_NATS_CREDS", show_envvar=True, help="Path to a NATS .creds file."
    ),
    click.option(
        "--tls-ca", envvar="REBASER_NATS_TLS_CA", show_envvar=True, help="CA certificate (PEM) for NATS TLS."
    ),
    click.option(
        "--tls-cert",
        envvar="REBASER_NATS_TLS_CERT",
        show_envvar=True,
        help="Client certificate (PEM) for NATS TLS.",
    ),
    click.option(
        "--tls-key", envvar="REBASER_NATS_TLS_KEY", show_envvar=True, help="Client key (PEM) for NATS TLS."
    ),
)

# The embedded nats-server's store, address and fsync (when no --nats-url is given).
embedded_server_options = _group(
    click.option(
        "--data-dir",
        type=click.Path(path_type=Path, file_okay=False),
        default=None,
        envvar="REBASER_DATA_DIR",
        show_envvar=True,
        show_default="~/.local/share/rebaser",
        help="Store of the embedded server.",
    ),
    click.option(
        "--port",
        "embedded_port",
        type=int,
        default=DEFAULT_EMBEDDED_PORT,
        envvar="REBASER_EMBEDDED_PORT",
        show_envvar=True,
        help="Client port of the embedded server (0 picks a free one).",
    ),
    click.option(
        "--host",
        "embedded_host",
        default=DEFAULT_EMBEDDED_HOST,
        envvar="REBASER_EMBEDDED_HOST",
        show_envvar=True,
        help="Address the embedded server listens on (0.0.0.0 in a container, to be reachable from outside it).",
    ),
    click.option(
        "--sync",
        "embedded_sync",
        default="always",
        envvar="REBASER_SYNC",
        show_envvar=True,
        callback=_check_sync,
        help="When the embedded server writes to disk: always (fsync before every acknowledgement, so a power loss "
        "loses nothing acknowledged), a duration such as 1s (faster; a power loss or kernel crash loses up to that "
        "much), or interval (nats-server's default, 2m). An external server's is its own: see --nats-monitoring-url.",
    ),
)

# The health endpoint (/healthz, /readyz, /status, /metrics): where it listens and the token it wants.
health_endpoint_options = _group(
    click.option(
        "--http-host",
        default=ServerConfig.http_host,  # rebaser_server.ops.http.DEFAULT_HTTP_HOST (it imports aiohttp)
        envvar="REBASER_HTTP_HOST",
        show_envvar=True,
        help="Address of the health endpoint (/healthz, /readyz, /status, /metrics).",
    ),
    click.option(
        "--http-port",
        type=int,
        default=ServerConfig.http_port,  # rebaser_server.ops.http.DEFAULT_HTTP_PORT
        envvar="REBASER_HTTP_PORT",
        show_envvar=True,
        help="Port of the health endpoint; 0 picks a free one, -1 turns it off.",
    ),
    click.option(
        "--http-token",
        default=None,
        envvar="REBASER_HTTP_TOKEN",
        show_envvar=True,
        help="Bearer token /status and /metrics want (Authorization: Bearer <token>); /healthz and /readyz stay open. "
        "Without one, /status and /metrics answer only this host unless --http-host is a loopback address.",
    ),
    click.option(
        "--http-token-file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        envvar="REBASER_HTTP_TOKEN_FILE",
        show_envvar=True,
        help="A file holding the --http-token (its first line), e.g. a mounted secret.",
    ),
)
