"""The application contract: what an application (``--app``) implements and what it is handed.

Owns :class:`RebaserApp` (apply one request to a change set's state, run its dependent values update), the base
class :class:`App` with every default, :class:`ChangeSet` (which can read another change set's committed state and
a request's stored batch through its :class:`ChangeSetReader`), :class:`Applied`, the optional queries, commit
hooks and change-set merge, :func:`load_app`, how long a step's lease is sure to hold (:func:`lease_deadline`),
and how the daemon calls an app (:mod:`~rebaser_server.app.calls`). The guide is ``docs/apps.md``.

May import: ``rebaser_core`` only. Everything else in the server builds on this package; the built-in
applications (:mod:`rebaser_server.apps`) implement it.
"""

from rebaser_server.app.base import App
from rebaser_server.app.contract import (
    Applied,
    AppState,
    ChangeSet,
    ChangeSetReader,
    ChangeSetView,
    CommitHooks,
    Committed,
    RebaserApp,
    SupportsChangeSetApply,
    SupportsDescribe,
    SupportsFork,
    SupportsQueries,
    load_app,
    make_app,
)
from rebaser_server.app.lease import lease_deadline, lease_left

__all__ = [
    "App",
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
    "lease_deadline",
    "lease_left",
    "load_app",
    "make_app",
]
