"""Who waits for a turn in the fair intake of one shard: how a daemon knows which workspaces have tasks waiting.

- **published**: it subscribes (plain NATS, no consumer) to the shard's task subjects; a task's publish is seen as
  it is stored, and its workspace joins the line at once;
- **found**: every :data:`_DISCOVER_EVERY` seconds, and at start, it reads the workspaces with tasks from the
  tasks stream's subjects (a publish missed during a reconnect, a daemon started after it);
- **left over**: a turn that takes a workspace's last waiting task tells (the delivery's pending count) whether
  more wait;
- **handed back**: a task this daemon hands back (a retry, a reconnect, a shutdown) joins its workspace to the line
  once it is ready again.

:class:`FairLine` is the base of :class:`~rebaser_server.intake.fair_intake.FairIntake`, which serves the line in
turns (rebaser_server.intake.turns).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from nats.aio.msg import Msg

from rebaser_core.errors import InvalidSubject
from rebaser_core.ids import WorkspacePk
from rebaser_core.nats import cancellation
from rebaser_core.nats.listing import stream_subjects
from rebaser_core.subjects import Subjects
from rebaser_server.changeset.context import Nats
from rebaser_server.intake.newcomers import Newcomers
from rebaser_server.intake.turns import WorkspaceTurns

__all__ = ["FairLine"]

log = logging.getLogger(__name__)

# The workspaces with tasks are read from the stream this often (the backstop for a publish not seen).
_DISCOVER_EVERY = 10.0
# A handed-back task's workspace joins the line this long after the task is due back (each a no-wait pull).
_HANDED_BACK_LOOKS = (0.0, 0.25, 1.0)
# Task subject heads whose workspace is remembered at most (then forgotten all at once).
_SEEN = 10_000
# A turn given for a task's publish may pull before the stream has stored the task (the daemon hears the publish as
# the stream does, and its pull may come first): a turn that finds nothing then is given again this long after, each
# in turn, instead of leaving the task to the watch's next look (half of ack_wait: 1.25 s at the defaults).
_FRESH_LOOKS = (0.005, 0.025, 0.1, 0.4)


class FairLine:
    """The fair intake's side that hears of workspaces with tasks waiting and puts them in the line (:attr:`turns`)."""

    # The intake's state this reads and sets (FairIntake.__init__ says what each is).
    _nats: Nats
    _subjects: Subjects
    _stopping: Callable[[], bool]
    turns: WorkspaceTurns
    newcomers: Newcomers
    _joined: asyncio.Event
    _known: dict[WorkspacePk, float]
    _seen: dict[str, WorkspacePk]
    _fresh: dict[WorkspacePk, int]
    fresh_looks: int
    empty_turns: int

    def _join(self, workspace: WorkspacePk) -> None:
        if workspace not in self._known:
            self.newcomers.check(workspace)  # it joins once found with work (newcomers.py)
        elif self.turns.wait(workspace):
            self._joined.set()

    def _ready(self, workspace: WorkspacePk) -> None:
        """``workspace`` was checked and has its consumer: its turn is next."""
        self._known[workspace] = time.monotonic()
        if self.turns.wait(workspace, first=True):
            self._joined.set()

    def handed_back(self, workspace: WorkspacePk, delay: float) -> None:
        """A task of ``workspace`` went back to its queue, ready again after ``delay``: its workspace joins the line
        then (no publish says so; else only a look of the watch would find it), and twice more a little later
        (nats-server makes a delayed task ready on a timer of its own, which may fire after ours)."""
        loop = asyncio.get_running_loop()
        for later in _HANDED_BACK_LOOKS:
            loop.call_later(delay + later, self._join, workspace)

    def _on_task(self, msg: Msg) -> None:
        """A task was published: its workspace joins the line, or is checked (handled in nats-py's read loop, the
        workspace of a subject seen before found by its head: a flood of publishes from one caller, thousands a
        second, costs a few dictionary look-ups each)."""
        subject = msg.subject
        head = subject[: subject.rfind(".", 0, subject.rfind("."))]  # up to the workspace token
        workspace = self._seen.get(head)
        if workspace is None:
            try:
                workspace = self._subjects.parse_task(subject).workspace_id
            except InvalidSubject:
                return
            if len(self._seen) >= _SEEN:
                self._seen.clear()
            self._seen[head] = workspace
        if len(self._fresh) >= _SEEN:
            self._fresh.clear()
        self._fresh[workspace] = len(_FRESH_LOOKS)
        self._join(workspace)

    def _found(self, workspace: WorkspacePk, got: int) -> None:
        """After a turn of ``workspace`` that took ``got`` tasks: one that found none right after a publish was
        heard is given another turn a little later (the stream may not have had the task yet)."""
        if not got:
            self.empty_turns += 1
        left = self._fresh.pop(workspace, 0)
        if got or not left:
            return
        self._fresh[workspace] = left - 1
        self.fresh_looks += 1
        asyncio.get_running_loop().call_later(_FRESH_LOOKS[-left], self._join, workspace)

    async def _discover(self) -> None:
        """Every workspace with a task in the stream joins the line (it may be owned: a turn then finds nothing)."""
        tasks = await stream_subjects(self._nats.js, self._subjects.tasks_stream, self._subjects.tasks_all)
        for subject in tasks:
            with contextlib.suppress(InvalidSubject):
                self._join(self._subjects.parse_task(subject).workspace_id)

    async def _discover_loop(self) -> None:
        while not self._stopping():
            try:
                await self._discover()
            except Exception as err:  # NATS trouble: look again next time
                log.debug("reading the workspaces with tasks failed: %r", err)
            await cancellation.sleep(_DISCOVER_EVERY)
