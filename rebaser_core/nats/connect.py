"""Connecting to NATS with the options an operator passes (auth and TLS passed straight through to nats-py).

nats-py (and asyncio) are imported where a connection is made, not with this module: the command lines check
their ``--nats-url`` with :func:`check_server_url` before they know whether they will connect at all.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rebaser_core.errors import InvalidUrl

if TYPE_CHECKING:
    import ssl

    from nats.aio.client import Client as NatsClient

__all__ = [
    "SERVER_URL_SCHEMES",
    "ConnectOptions",
    "check_server_url",
    "close_connection",
    "connect",
    "connection_state",
    "redact_url",
]

log = logging.getLogger(__name__)

# The schemes nats-py connects with (nats.aio.client: TCP, TCP with TLS, WebSocket, WebSocket with TLS). A URL
# without one (``host:4222``) is read as ``nats://``.
SERVER_URL_SCHEMES = ("nats", "tls", "ws", "wss")


def redact_url(url: str) -> str:
    """``url`` with its credentials (``user:password@`` or ``token@``) replaced by ``***@``: the one way a server
    URL is shown or logged, since operators put credentials in them."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" not in rest:
        return url
    host = rest.rpartition("@")[2]  # rpartition: a password may contain '@'
    return f"{scheme}{sep}***@{host}"


def check_server_url(url: str) -> str:
    """``url`` if nats-py can connect with it, else :class:`~rebaser_core.errors.InvalidUrl` saying why.

    nats-py itself takes any other scheme for a host name (``http://n1:4222`` becomes the host ``http``), so the
    mistake would surface as a failed name lookup."""
    scheme, sep, _ = url.partition("://")
    allowed = ", ".join(f"{s}://" for s in SERVER_URL_SCHEMES)
    if sep and scheme not in SERVER_URL_SCHEMES:
        raise InvalidUrl(
            f"{redact_url(url)}: {scheme + '://' if scheme else 'an empty scheme'} is not a NATS URL scheme; "
            f"use one of {allowed} (e.g. nats://127.0.0.1:4222)"
        )
    try:
        parts = urlsplit(url if sep else f"nats://{url}")
        _ = parts.port  # a port that is not a number raises here
    except ValueError as err:
        raise InvalidUrl(f"{redact_url(url)} is not a NATS server URL: {err}") from None
    if not parts.hostname:
        raise InvalidUrl(f"{redact_url(url)} names no host (e.g. nats://127.0.0.1:4222)")
    return url


@dataclass(frozen=True)
class ConnectOptions:
    """How to connect. Every server URL is checked when the options are made (:func:`check_server_url`)."""

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    name: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    nkeys_seed: str | None = None  # path to an nkey seed file
    creds: str | None = None  # path to a .creds file (JWT + seed)
    # Where the client's replies and inboxes live: a caller in an account of its own imports only its own prefix
    # (docs/accounts.md), e.g. "_INBOX.client-1". None: nats-py's "_INBOX".
    inbox_prefix: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    connect_timeout: float = 5.0
    # nats-py buffers publishes while reconnecting; keep that buffer small (bytes) so memory stays bounded.
    pending_size: int = 8 * 1024 * 1024
    extra: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        # Never shows credentials: passwords and tokens are left out, server URLs redacted (extra is not shown).
        shown: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        shown["servers"] = tuple(redact_url(s) for s in self.servers)
        shown.pop("extra", None)
        return f"ConnectOptions({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def __post_init__(self) -> None:
        for url in self.servers:
            check_server_url(url)

    def tls_context(self) -> ssl.SSLContext | None:
        if not (self.tls_ca or self.tls_cert):
            return None
        import ssl

        context = ssl.create_default_context(cafile=self.tls_ca)
        if self.tls_cert:
            context.load_cert_chain(self.tls_cert, self.tls_key)
        return context

    def kwargs(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "servers": list(self.servers),
            "connect_timeout": self.connect_timeout,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.5,
            "pending_size": self.pending_size,
        }
        for key in ("name", "user", "password", "token", "nkeys_seed", "inbox_prefix"):
            value = getattr(self, key)
            if value is not None:
                options[key] = value
        if self.creds:
            options["user_credentials"] = self.creds
        tls = self.tls_context()
        if tls is not None:
            options["tls"] = tls
        options.update(self.extra)
        return options


async def _log_error(err: Exception) -> None:
    log.warning("nats: %s", err)


async def connect(options: ConnectOptions) -> NatsClient:
    """Connect, retrying reconnects forever afterwards, but giving up on the *first* connect after
    ``connect_timeout`` per server (nats-py would otherwise retry an unreachable server forever)."""
    import asyncio

    from nats.aio.client import Client as NatsClient

    kwargs = options.kwargs()
    kwargs.setdefault("error_cb", _log_error)
    nc = NatsClient()
    try:
        async with asyncio.timeout(options.connect_timeout * max(1, len(options.servers)) + 1.0):
            await nc.connect(**kwargs)
    except TimeoutError:
        await nc.close()
        raise TimeoutError(f"could not connect to {', '.join(map(redact_url, options.servers))}") from None
    return nc


def connection_state(nc: NatsClient) -> str:
    """One word for a nats-py connection's state, for status pages: connected, reconnecting, connecting,
    draining, closed or disconnected."""
    if nc.is_closed:
        return "closed"
    if nc.is_draining:
        return "draining"
    if nc.is_connected:
        return "connected"
    if nc.is_reconnecting:
        return "reconnecting"
    if nc.is_connecting:
        return "connecting"
    return "disconnected"


async def close_connection(nc: NatsClient) -> None:
    """Drain a connection, or close it if it cannot be drained, without raising during a NATS outage.

    nats-py refuses to drain while reconnecting, and closing then flushes its reconnect buffer into the dead socket,
    raising ConnectionResetError (the connection ends up closed all the same). Neither should turn a clean shutdown
    into a crash: whatever was still buffered could not have been delivered anyway.
    """
    import nats.errors

    if nc.is_closed:
        return
    if nc.is_connected:
        try:
            await nc.drain()
            return
        except nats.errors.Error:
            pass
    with contextlib.suppress(OSError, nats.errors.Error):
        await nc.close()
