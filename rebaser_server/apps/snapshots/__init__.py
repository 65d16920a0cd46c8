"""The built-in application: change-set snapshots, rebase with conflicts, and dependent values update.

``model`` is the pure logic, ``functions`` the safe function set, ``store`` the object-store persistence and
``app`` the :class:`~rebaser_server.app.RebaserApp` that ties them to the daemon.
"""

from rebaser_server.apps.snapshots.app import SnapshotApp

__all__ = ["SnapshotApp"]
