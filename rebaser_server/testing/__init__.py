"""Testing applications and the daemon: checkpoint hooks that force an interleaving, settings for fast tests,
a daemon in a context manager, and the pytest plugin (fixtures ``rebaser_nats``, ``rebaser_daemon``, ...).

May import: :mod:`rebaser_server.daemon` and everything below it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rebaser_server.testing.tools import (
        CheckpointGate,
        RecordingHooks,
        describe_state,
        fast_settings,
        running_daemon,
    )

__all__ = ["CheckpointGate", "RecordingHooks", "describe_state", "fast_settings", "running_daemon"]


def __getattr__(name: str) -> Any:
    # Imported when first used: the pytest plugin beside this module must load without the daemon.
    if name not in __all__:
        raise AttributeError(f"module 'rebaser_server.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module("rebaser_server.testing.tools"), name)
    globals()[name] = value
    return value
