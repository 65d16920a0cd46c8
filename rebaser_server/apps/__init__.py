"""Applications the daemon can run (``rebaser-server --app module:attr``): the built-in ones.

- :mod:`~rebaser_server.apps.snapshots`: the default, a change set's state as a pointer to its snapshot;
- :mod:`~rebaser_server.apps.counter`: the smallest app, a counter (the benchmarks' yardstick).

May import: ``rebaser_core`` and :mod:`rebaser_server.app` (the contract), as any application would. Besides
those, the snapshot app reads another change set's record through :mod:`rebaser_server.record` for a fork.
"""
