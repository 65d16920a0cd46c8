"""The operators' side of rebaser_client: the ``rebaser`` command and the reads and writes behind it.

The library (``RebaserClient``, ``SyncRebaserClient`` and the modules they use) is what an application imports; this
package is what an operator runs. It owns:

- :mod:`~rebaser_client.admin.cli`: the ``rebaser`` command (the console script is
  ``rebaser_client.admin.cli.main:main``): options, one-line errors, tables and ``--json``.
- :mod:`~rebaser_client.admin.format`, :mod:`~rebaser_client.admin.format_workspaces`: the reports as rich tables and
  JSON-able data, ``change-set show``'s in :mod:`~rebaser_client.admin.format_change_set`. Pure: no NATS, no I/O.
- :mod:`~rebaser_client.admin.status`, :mod:`~rebaser_client.admin.change_set`: ``rebaser status`` and
  ``change-set show``, read-only, through :mod:`~rebaser_client.admin.reader`; the busiest workspaces come from
  :mod:`~rebaser_client.admin.workspaces`.
- :mod:`~rebaser_client.admin.dead_letters`, :mod:`~rebaser_client.admin.repairs`: reading the dead letters; replaying
  or dropping them, and purging a change set's queue.
- :mod:`~rebaser_client.admin.streams`, :mod:`~rebaser_client.admin.intake`: changing the shard layout and the intake
  online.

Pausing, resuming and skipping a request are not here: they are the library's (``RebaserClient.pause_change_set``
and its kin, in ``rebaser_client._pausing`` and ``rebaser_client._skipping``), and the commands call them as an
application would.

May import: the library (``rebaser_client``'s own modules) and ``rebaser_core``; never ``rebaser_server`` (the client
never imports the server). The library never imports this package, so an application that uses ``RebaserClient``
loads neither the command line nor rich. Inside it, the command line sits above the formatting, which sits above the
reads and writes. The import-linter contracts in ``pyproject.toml`` hold all three.
"""
