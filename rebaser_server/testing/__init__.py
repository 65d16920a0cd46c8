"""Testing applications and the daemon: checkpoint hooks that force an interleaving, settings for fast tests,
a daemon in a context manager, an in-memory reader to unit-test an app without a daemon (``MemoryReader``), and
the pytest plugin (fixtures ``rebaser_nats``, ``rebaser_daemon``, ...).

May import: :mod:`rebaser_server.daemon` and everything below it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rebaser_server.testing.memory import MemoryReader
    from rebaser_server.testing.tools import (
        CheckpointGate,
        RecordingHooks,
        describe_state,
        fast_settings,
        running_daemon,
    )

__all__ = [
    "CheckpointGate",
    "MemoryReader",
    "RecordingHooks",
    "describe_state",
    "fast_settings",
    "running_daemon",
]
_WHERE = {"MemoryReader": "rebaser_server.testing.memory"}


def __getattr__(name: str) -> Any:
    # Imported when first used: the pytest plugin beside this module must load without the daemon.
    if name not in __all__:
        raise AttributeError(f"module 'rebaser_server.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE.get(name, "rebaser_server.testing.tools")), name)
    globals()[name] = value
    return value
