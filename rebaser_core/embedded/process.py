"""Starting a nats-server process that only its owner stops.

- Its own session (``start_new_session``): a terminal's Ctrl-C goes to the whole foreground process group, so
  without it the server would stop at the same moment as its owner, before the owner's hand-backs and last writes
  reached it. The owner stops it, last.
- Optionally (``die_with_parent``, Linux) the parent-death signal: when the owner dies without stopping it
  (``kill -9``), the kernel sends the server SIGTERM, so it never lives on as an orphan on the owner's store.
  ``prctl(PR_SET_PDEATHSIG)`` must be called in the child before ``exec``; a ``preexec_fn`` would run Python
  between ``fork`` and ``exec``, which can deadlock when the owner has threads, so a tiny launcher interpreter sets
  it and then ``exec``s nats-server (same PID). The signal follows the *thread* that started the child: start the
  server from a thread that lives as long as the owner (the main thread).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

__all__ = ["PDEATHSIG_SUPPORTED", "launch_command"]

PDEATHSIG_SUPPORTED = sys.platform.startswith("linux")

# argv: <parent pid> <program> <args...>. PR_SET_PDEATHSIG is 1. If the parent died before prctl took effect we
# have been re-parented already and no signal will ever come: exit instead of running as an orphan.
_LAUNCHER = f"""
import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).prctl(1, {int(signal.SIGTERM)}, 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_PDEATHSIG) failed: " + os.strerror(ctypes.get_errno()))
if os.getppid() != int(sys.argv[1]):
    sys.exit("the parent exited before nats-server started")
os.execv(sys.argv[2], sys.argv[2:])
"""


def launch_command(argv: Sequence[str], *, die_with_parent: bool) -> list[str]:
    """``argv``, wrapped in the parent-death launcher when asked for and supported."""
    if not (die_with_parent and PDEATHSIG_SUPPORTED):
        return list(argv)
    # -I -S: isolated and without site-packages, so the launcher starts fast and no environment changes it.
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), *argv]
