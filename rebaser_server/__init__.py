"""rebaser's daemon: applies each change set's requests strictly one at a time, in order, by exactly one daemon.

The public face is this module: the daemon, the application contract and the daemon's configuration. Everything
else is reached through the sub-packages below, whose ``__init__`` says what each owns and what it may import.

The layers, top to bottom (a package imports only packages below it, never one beside it; ``make lint`` checks it
with import-linter, see the ``[tool.importlinter]`` contracts in ``pyproject.toml``)::

    cli          rebaser-server: flags, config file, signals
    devtools     demo, dev cluster, dev load          testing    test tools, the pytest plugin
    daemon       the process: an intake per served shard, the change sets owned, orphan sweep, shutdown
    queries      get, fork, reply, settled: any daemon answers them, for any change set
    intake       beside queries: which task a daemon takes next (fifo, or fair: workspaces in turns), admission
    changeset    the life of one owned change set: consume, decide, carry out, DVU, let go
    ops          metrics, logs, traces, health: reads the daemon through a Protocol of its own
    record       the change set's record in KV: its form, the store, the fence
    task         owning a task delivery: lease, keeper, hand-back
    app          the application contract (apps/ holds the built-in applications)

``rebaser_core`` (the wire contract, and the NATS plumbing in ``rebaser_core.nats``) sits below all of them.
``rebaser_client`` never imports this package; this package imports the client only in tooling that drives a daemon
as its users do (``devtools.demo``, ``devtools.devload``, ``testing.pytest_plugin``: the exceptions the
import-linter contract lists).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rebaser_core.errors import RefusedError, RetryableError, UnprocessableError
    from rebaser_core.settings import Settings
    from rebaser_server.app import (
        App,
        Applied,
        AppState,
        ChangeSet,
        ChangeSetView,
        Committed,
        RebaserApp,
        load_app,
    )
    from rebaser_server.changeset.hooks import Hooks
    from rebaser_server.daemon.config import ServerConfig
    from rebaser_server.daemon.daemon import Daemon

__all__ = [
    "App",
    "AppState",
    "Applied",
    "ChangeSet",
    "ChangeSetView",
    "Committed",
    "Daemon",
    "Hooks",
    "RebaserApp",
    "RefusedError",
    "RetryableError",
    "ServerConfig",
    "Settings",
    "UnprocessableError",
    "load_app",
]

# Each name is imported when first used: the pytest plugin (rebaser_server.testing.pytest_plugin) is loaded in
# every pytest run of an environment with rebaser installed, and must not pay for the daemon (or nats-py) then.
_WHERE = {
    "App": "rebaser_server.app",
    "AppState": "rebaser_server.app",
    "Applied": "rebaser_server.app",
    "ChangeSet": "rebaser_server.app",
    "ChangeSetView": "rebaser_server.app",
    "Committed": "rebaser_server.app",
    "Daemon": "rebaser_server.daemon.daemon",
    "Hooks": "rebaser_server.changeset.hooks",
    "RebaserApp": "rebaser_server.app",
    "RefusedError": "rebaser_core.errors",
    "RetryableError": "rebaser_core.errors",
    "UnprocessableError": "rebaser_core.errors",
    "ServerConfig": "rebaser_server.daemon.config",
    "Settings": "rebaser_core.settings",
    "load_app": "rebaser_server.app",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rebaser_server' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
