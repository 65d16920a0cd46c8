"""The daemon process: its intake per served shard, one processor per owned change set, the orphan sweep, shutdown.

The tasks reach the daemon through :mod:`rebaser_server.intake` (which workspace's task is taken next, the pulls,
admission); what the daemon does with a task taken, and everything else a process does, is here:

- :mod:`~rebaser_server.daemon.daemon`: :class:`Daemon`, the wiring, start-up and shutdown;
- :mod:`~rebaser_server.daemon.readouts`: what a daemon shows of itself, the properties operations code
  (:class:`~rebaser_server.ops.view.DaemonView`), tests and embedding code read;
- :mod:`~rebaser_server.daemon.reconnect`: what the daemon does after every reconnect to NATS;
- :mod:`~rebaser_server.daemon.owned`: the change sets owned now, each from its task taken to the task's end (the
  intake reaches them through :class:`~rebaser_server.intake.owner.Owner`);
- :mod:`~rebaser_server.daemon.startup`: set-up retried while the cluster is still forming, the app's start, and
  stopping a background task within a bound;
- :mod:`~rebaser_server.daemon.shards`: which shards the daemon serves, one intake's pull loop per served shard,
  following the cluster's shard layout;
- :mod:`~rebaser_server.daemon.liveness`: ``lease_mode`` daemon, this daemon's heartbeat and the reaper of a silent
  peer's tasks;
- :mod:`~rebaser_server.daemon.pauses`: the paused change sets and workspaces, as the daemon watches them;
- :mod:`~rebaser_server.daemon.sweeper`, :mod:`~rebaser_server.daemon.junk`: the orphan sweep, and messages on
  malformed subjects;
- :mod:`~rebaser_server.daemon.config`: :class:`ServerConfig`, what a daemon process is started with.

May import: everything below it (:mod:`rebaser_server.intake`, :mod:`rebaser_server.queries` and down).
"""
