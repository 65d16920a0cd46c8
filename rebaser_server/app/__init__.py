"""The application contract: what an application (``--app``) implements and what it is handed.

Owns :class:`RebaserApp` (apply one request to a change set's state, run its dependent values update),
:class:`ChangeSet`, :class:`Applied`, the optional commit and query hooks, and :func:`load_app`.

May import: ``rebaser_core`` only. Everything else in the server builds on this package; the built-in
applications (:mod:`rebaser_server.apps`) implement it.
"""

from rebaser_server.app.contract import (
    Applied,
    AppState,
    ChangeSet,
    ChangeSetView,
    CommitHooks,
    RebaserApp,
    SupportsQueries,
    load_app,
)

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
