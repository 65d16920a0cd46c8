"""The application seam: what a daemon runs for each request and for each dependent-values update.

The framework (tasks, ownership, ordering, acks, deletes, replies, dead letters, idempotency and fencing) is the
same for every application; an application only transforms a change set's *state*, a JSON-compatible value that
the framework stores in the change set's record and commits with compare-and-set. An application therefore
never sees NATS messages and can be unit-tested as plain Python.

Contract:

- ``apply`` is called for each request of a change set, one at a time, in order, with the state as of the last
  commit. It returns an :class:`Applied` (success or conflicts, the new state, whether a DVU is now due) or raises
  :class:`~rebaser_core.errors.RetryableError` (try again later) or
  :class:`~rebaser_core.errors.UnprocessableError` (never: dead-letter it). Any other exception counts as
  retryable until ``Settings.max_attempts`` is reached.
- ``dependent_values_update`` returns the new state after recomputing dependent values. It never runs
  concurrently with ``apply`` for the same change set.
- Side effects outside the returned state must be idempotent (for example content-addressed writes): a stale
  owner's work is thrown away at the commit, and a request may be applied again after a crash before commit.
- Optional: ``async def prepare_commit(self, change_set, state) -> None`` is called with a state that ``apply`` or
  ``dependent_values_update`` returned, right *before* the record holding it is committed (once per group commit:
  several requests' states are staged and only the last is committed). Writing there what the state refers to
  (for example a snapshot object) costs one write per commit instead of one per request, and a record never
  points to something missing: if it raises, nothing is committed and the requests are processed again.
  ``def abandon_commit(self, change_set) -> None`` (optional too) is called whenever a group ends (committed,
  failed or fenced) and when a DVU's state is not committed, to forget what was kept for ``prepare_commit``.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from nats.aio.client import Client as NatsClient

from rebaser_core.api import ConflictsStatus, EnqueueUpdatesRequest, SuccessStatus
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings

__all__ = [
    "AppState",
    "Applied",
    "ChangeSet",
    "ChangeSetView",
    "CommitHooks",
    "RebaserApp",
    "SupportsQueries",
    "load_app",
]

AppState = Any
"""A JSON-compatible value (dicts, lists, strings, numbers, booleans, None)."""


@dataclass(frozen=True, slots=True)
class ChangeSet:
    workspace_id: WorkspacePk
    change_set_id: ChangeSetId

    def __str__(self) -> str:
        return f"{self.workspace_id}/{self.change_set_id}"


@dataclass(frozen=True, slots=True)
class Applied:
    """The result of applying one request."""

    status: SuccessStatus | ConflictsStatus
    state: AppState
    dvu: bool = False


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
class SupportsQueries(Protocol):
    """Optional: apps that can show their state and fork a change set from another one's."""

    async def describe(self, change_set: ChangeSet, state: AppState, path: str | None) -> ChangeSetView:
        """The values of ``state`` (only ``path`` if given)."""

    def fork(self, change_set: ChangeSet, source: ChangeSet, source_state: AppState) -> AppState:
        """The initial state of ``change_set`` forked from ``source`` at ``source_state``."""


def load_app(spec: str) -> RebaserApp:
    """Load ``module:attr``. ``attr`` may be an app object, or a class or factory called with no arguments."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"app must be given as 'module:attribute', got {spec!r}")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    app = target() if isinstance(target, type) or not isinstance(target, RebaserApp) else target
    if not isinstance(app, RebaserApp):
        raise TypeError(
            f"{spec} is not a rebaser app (needs start, stop, initial_state, apply, dependent_values_update)"
        )
    return app
