"""Testing applications and the daemon: checkpoint hooks that force an interleaving, settings for fast tests,
a daemon in a context manager, and the pytest plugin (fixtures ``rebaser_nats``, ``rebaser_daemon``, ...).

May import: :mod:`rebaser_server.daemon` and everything below it.
"""

from rebaser_server.testing.tools import (
    CheckpointGate,
    RecordingHooks,
    describe_state,
    fast_settings,
    running_daemon,
)

__all__ = ["CheckpointGate", "RecordingHooks", "describe_state", "fast_settings", "running_daemon"]
