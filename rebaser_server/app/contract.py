"""The application seam: what a daemon runs for each request and for each dependent-values update.

The framework (tasks, ownership, ordering, acks, deletes, replies, dead letters, idempotency and fencing) is the
same for every application; an application only transforms a change set's *state*, a JSON-compatible value that
the framework stores in the change set's record and commits with compare-and-set. An application therefore
never sees NATS messages and can be unit-tested as plain Python. The guide is ``docs/apps.md``.

Contract (:class:`RebaserApp`; the base class :class:`~rebaser_server.app.base.App` gives every default):

- ``apply`` is called for each request of a change set, one at a time, in order, with the state as of the last
  commit. It returns an :class:`Applied` (success or conflicts, the new state, whether a DVU is now due) or raises
  :class:`~rebaser_core.errors.RefusedError` (the request is wrong: a ``refused`` reply, nothing dead-lettered),
  :class:`~rebaser_core.errors.RetryableError` (try again later) or
  :class:`~rebaser_core.errors.UnprocessableError` (an operator must look: an error reply and a dead letter). Any
  other exception counts as retryable until ``Settings.max_attempts`` is reached. ``change_set.updates(request)``
  gives a request's updates, inline or from a stored batch.
- A request with ``from_change_set_id`` (apply another change set onto this one) goes to the optional
  ``apply_change_set`` instead, with that change set's committed state; an app without it refuses such requests.
- ``dependent_values_update`` returns the new state after recomputing dependent values. It never runs
  concurrently with ``apply`` for the same change set.
- Side effects outside the returned state must be idempotent (for example content-addressed writes): a stale
  owner's work is thrown away at the commit, and a request may be applied again after a crash before commit.
- Optional queries: ``describe`` (a ``get`` shows the committed state) and ``fork`` (a new change set starts from
  another one's state); without them the daemon answers those queries with an error.
- Optional commit hooks: ``async def prepare_commit(self, change_set, state) -> None`` is called with a state that
  ``apply`` or ``dependent_values_update`` returned, right *before* the record holding it is committed (once per
  group commit: several requests' states are staged and only the last is committed). Writing there what the state
  refers to (for example a snapshot object) costs one write per commit instead of one per request, and a record
  never points to something missing: if it raises, nothing is committed and the requests are processed again.
  ``def abandon_commit(self, change_set) -> None`` is called whenever a group ends (committed, failed or fenced)
  and when a DVU's state is not committed, to forget what was kept for ``prepare_commit``.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from nats.aio.client import Client as NatsClient

from rebaser_core.api import ConflictsStatus, EnqueueUpdatesRequest, InlineUpdates, SuccessStatus, Update
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings

__all__ = [
    "AppState",
    "Applied",
    "ChangeSet",
    "ChangeSetReader",
    "ChangeSetView",
    "CommitHooks",
    "Committed",
    "RebaserApp",
    "SupportsChangeSetApply",
    "SupportsDescribe",
    "SupportsFork",
    "SupportsQueries",
    "load_app",
    "make_app",
]

AppState = Any
"""A JSON-compatible value (dicts, lists, strings, numbers, booleans, None)."""


@dataclass(frozen=True, slots=True)
class Committed:
    """A change set's state as last committed (read-only: the app never writes another change set)."""

    change_set: ChangeSet
    state: AppState


class ChangeSetReader(Protocol):
    """What the daemon lets an app read besides the change set it applies: the daemon gives one to every
    :class:`ChangeSet` it hands the app; a unit test gives its own (``rebaser_server.testing.MemoryReader``)."""

    async def committed(self, change_set: ChangeSet) -> Committed | None:
        """``change_set``'s state as last committed; None if it was never written."""

    async def stored_updates(self, workspace_id: WorkspacePk, address: str) -> list[Update]:
        """The updates of a batch stored for ``workspace_id``; :class:`~rebaser_core.errors.UnprocessableError`
        if it is missing (another workspace's batch is missing too), corrupt or over the limits."""


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """Which change set (a workspace and a change set id): equal and hashed by those two alone, so an app may key
    what it keeps per change set by it. The one the daemon hands the app can also read (:meth:`read`,
    :meth:`updates`)."""

    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    reader: ChangeSetReader | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.workspace_id}/{self.change_set_id}"

    def sibling(self, change_set_id: ChangeSetId) -> ChangeSet:
        """Another change set of the same workspace, reading through the same reader."""
        return ChangeSet(self.workspace_id, change_set_id, self.reader)

    async def read(self, change_set_id: ChangeSetId) -> Committed | None:
        """Another change set of this workspace as last committed (None if it was never written). Its state may
        move on right after: it is owned and committed by whichever daemon holds its task."""
        return await self._reader().committed(self.sibling(change_set_id))

    async def updates(self, request: EnqueueUpdatesRequest) -> list[Update]:
        """The updates ``request`` carries: inline, or read from the stored batch it names (bounded by the
        daemon's ``max_stored_batch_bytes`` and ``max_updates_per_request``)."""
        if isinstance(request.updates, InlineUpdates):
            return list(request.updates.updates)
        return await self._reader().stored_updates(self.workspace_id, request.updates.address)

    def _reader(self) -> ChangeSetReader:
        if self.reader is None:
            raise RuntimeError(
                f"change set {self} has no reader: the daemon gives one; a test passes "
                "ChangeSet(..., reader=rebaser_server.testing.MemoryReader(...))"
            )
        return self.reader


@dataclass(frozen=True, slots=True)
class Applied:
    """The result of applying one request: its status (success, or conflicts: nothing applied), the new state (on
    conflicts, the state given), and whether a dependent values update is now due."""

    status: SuccessStatus | ConflictsStatus
    state: AppState
    dvu: bool = False

    @classmethod
    def success(cls, state: AppState, updates_performed: int = 0, *, dvu: bool = False) -> Applied:
        return cls(SuccessStatus(updates_performed=updates_performed), state, dvu)


@runtime_checkable
class RebaserApp(Protocol):
    async def start(self, nc: NatsClient, settings: Settings) -> None:
        """Open whatever the app needs (stores, buckets). Called before any request; if it raises a NATS error, a
        ``TimeoutError`` or an ``OSError`` (JetStream not available yet: a cluster forming, a leader election), the
        daemon calls :meth:`stop`, waits, and calls it again, as it retries its own set-up."""

    async def stop(self) -> None:
        """Release what ``start`` opened."""

    def initial_state(self, change_set: ChangeSet) -> AppState:
        """The state of a change set that has never been written."""

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        """Apply one request to ``state``."""

    async def dependent_values_update(self, change_set: ChangeSet, state: AppState) -> AppState:
        """Recompute dependent values; return the new state."""


@dataclass(frozen=True, slots=True)
class CommitHooks:
    """An app's optional ``prepare_commit`` and ``abandon_commit`` (looked up once; missing ones do nothing)."""

    prepare: Callable[[ChangeSet, AppState], Awaitable[None]] | None = None
    abandon: Callable[[ChangeSet], None] | None = None

    @classmethod
    def of(cls, app: object) -> CommitHooks:
        return cls(getattr(app, "prepare_commit", None), getattr(app, "abandon_commit", None))

    async def before_commit(self, change_set: ChangeSet, state: AppState) -> None:
        if self.prepare is not None:
            await self.prepare(change_set, state)

    def abandoned(self, change_set: ChangeSet) -> None:
        if self.abandon is not None:
            self.abandon(change_set)


@dataclass(frozen=True, slots=True)
class ChangeSetView:
    """What a ``get`` query shows of a change set's committed state."""

    snapshot_address: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    forked_from: ChangeSetId | None = None


@runtime_checkable
class SupportsDescribe(Protocol):
    """Optional: an app whose committed state a ``get`` query can show."""

    async def describe(self, change_set: ChangeSet, state: AppState, path: str | None) -> ChangeSetView:
        """The values of ``state`` (only ``path`` if given)."""


@runtime_checkable
class SupportsFork(Protocol):
    """Optional: an app that can start a change set from another one's state (the ``fork`` query)."""

    def fork(self, change_set: ChangeSet, source: ChangeSet, source_state: AppState) -> AppState:
        """The initial state of ``change_set`` forked from ``source`` at ``source_state``."""


@runtime_checkable
class SupportsQueries(SupportsDescribe, SupportsFork, Protocol):
    """Both queries."""


@runtime_checkable
class SupportsChangeSetApply(Protocol):
    """Optional: an app that applies one change set onto another (requests with ``from_change_set_id``)."""

    async def apply_change_set(
        self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest, source: Committed
    ) -> Applied:
        """Apply what ``source`` (the change set ``request.from_change_set_id`` names, as last committed) holds
        onto ``state``; the same outcomes as ``apply``."""


def load_app(spec: str) -> RebaserApp:
    """Load ``module:attr``: an app object, or a class or factory called with no arguments to make one.

    Raises ``ValueError`` (the spec's form), ``ImportError``/``AttributeError`` (nothing there) or ``TypeError``
    (not an app), each message whole.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"an app is given as 'module:attribute' (e.g. mypackage.apps:CartApp), got {spec!r}")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError:
        raise
    except Exception as err:
        # A mistake in the app's own file (a SyntaxError, a NameError at module level): where it is, in one line,
        # not a traceback through importlib.
        raise ImportError(f"{module_name} failed to import: {where_raised(err)}") from None
    for part in attr.split("."):
        target = getattr(target, part)
    return make_app(target, spec)


def where_raised(err: BaseException) -> str:
    """``SyntaxError at app.py:3: invalid syntax``: the error's class, the file and line it comes from (for a
    SyntaxError, the line it is about; else the innermost frame of its traceback), and its message."""
    if isinstance(err, SyntaxError):
        file, line, message = err.filename, err.lineno, err.msg
    else:
        frames = traceback.extract_tb(err.__traceback__)
        file, line = (frames[-1].filename, frames[-1].lineno) if frames else (None, None)
        message = str(err)
    at = f" at {file}:{line}" if file else ""
    return f"{type(err).__name__}{at}: {message}"


def make_app(target: Any, name: str) -> RebaserApp:
    """``target`` as an app: an app object as it is, a class or factory called with no arguments."""
    # A class has the methods too (a Protocol check is true for it), so a class is always called.
    app = target if isinstance(target, RebaserApp) and not isinstance(target, type) else None
    if app is None and callable(target):
        app = target()
    if not isinstance(app, RebaserApp) or isinstance(app, type):
        missing = [m for m in _REQUIRED if not callable(getattr(app, m, None))]
        raise TypeError(f"{name} is not a rebaser app: it lacks {', '.join(missing) or 'the app methods'}")
    return app


_REQUIRED = ("start", "stop", "initial_state", "apply", "dependent_values_update")
