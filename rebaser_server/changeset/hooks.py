"""Named checkpoints in a change set's lifecycle, so tests can force an interleaving instead of sleeping.

The daemon awaits ``hooks.checkpoint(name, change_set)`` at each point below; the default does nothing. A test
passes its own :class:`Hooks` (see :class:`rebaser_server.testing.CheckpointGate`) to pause a daemon exactly
there, act, and let it continue.

=====================  =========================================================================
``acquired``           the change set's record was taken over (epoch bumped), before consuming
``stopped_consuming``  quiescence decided; the ordered consumer is gone; the task is not yet acked
``task_acked``         the task was acked (released); the final "anything queued?" check is next
``applied``            a request was committed, before its reply and delete
``purging``            processed requests are about to be purged from the stream (a hook that
                       raises here makes the purge fail, as a leader election would)
=====================  =========================================================================
"""

from __future__ import annotations

from rebaser_server.app import ChangeSet

__all__ = ["CHECKPOINTS", "Hooks"]

CHECKPOINTS = ("acquired", "stopped_consuming", "task_acked", "applied", "purging")


class Hooks:
    async def checkpoint(self, name: str, change_set: ChangeSet) -> None:
        """Called at each named point; override to observe or pause."""
