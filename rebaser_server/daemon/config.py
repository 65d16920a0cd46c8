"""The daemon's configuration: where NATS is, how to log in, which app to run, and the tunables."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rebaser_core.nats.connect import ConnectOptions
from rebaser_core.settings import Settings

__all__ = ["DEFAULT_APP", "DEFAULT_EMBEDDED_HOST", "DEFAULT_EMBEDDED_PORT", "ServerConfig"]

DEFAULT_APP = "rebaser_server.apps.snapshots:SnapshotApp"
# The embedded server listens where every NATS client looks first (the client CLI's default URL too).
DEFAULT_EMBEDDED_PORT = 4222
# Loopback: the embedded server has no authentication. A container listens on 0.0.0.0 (its network is the fence).
DEFAULT_EMBEDDED_HOST = "127.0.0.1"


@dataclass(frozen=True)
class ServerConfig:
    settings: Settings = field(default_factory=Settings)
    # None: start an embedded nats-server with a persistent store in ``data_dir``.
    connect: ConnectOptions | None = None
    app: str = DEFAULT_APP
    data_dir: Path = field(default_factory=lambda: Path.home() / ".local" / "share" / "rebaser")
    # The embedded server's client port (0 picks a free one) and address.
    embedded_port: int = DEFAULT_EMBEDDED_PORT
    embedded_host: str = DEFAULT_EMBEDDED_HOST
    # The embedded server's sync_interval: "always" (fsync before acknowledging), a duration, or None for
    # nats-server's default (2m). Always by default: an acknowledgement then survives a power loss.
    embedded_sync: str | None = "always"
    # The health endpoint (rebaser_server.ops.http): port 0 picks a free one, a negative port turns it off.
    http_host: str = "127.0.0.1"
    http_port: int = 9464  # rebaser_server.ops.http.DEFAULT_HTTP_PORT
    # What /status and /metrics want as "Authorization: Bearer <token>" (None: loopback peers only, unless bound to
    # loopback; rebaser_server.ops.http).
    http_token: str | None = field(default=None, repr=False)
    # "console" or "json" (rebaser_server.ops.logs): also how the start-up lines are written.
    log_format: str = "console"
