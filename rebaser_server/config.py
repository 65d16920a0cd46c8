"""The daemon's configuration: where NATS is, how to log in, which app to run, and the tunables."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rebaser_core.connect import ConnectOptions
from rebaser_core.settings import Settings

__all__ = ["DEFAULT_APP", "ServerConfig"]

DEFAULT_APP = "rebaser_server.apps.snapshots:SnapshotApp"


@dataclass(frozen=True)
class ServerConfig:
    settings: Settings = field(default_factory=Settings)
    # None: start an embedded nats-server with a persistent store in ``data_dir``.
    connect: ConnectOptions | None = None
    app: str = DEFAULT_APP
    data_dir: Path = field(default_factory=lambda: Path.home() / ".local" / "share" / "rebaser")
    embedded_port: int | None = None
    # The health endpoint (rebaser_server.http): port 0 picks a free one, a negative port turns it off.
    http_host: str = "127.0.0.1"
    http_port: int = 9090
