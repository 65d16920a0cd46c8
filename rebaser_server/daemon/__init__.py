"""The daemon process: take tasks from the shared consumer, run one processor per owned change set, shut down.

- :mod:`~rebaser_server.daemon.daemon`: :class:`Daemon`, the wiring, start-up and shutdown;
- :mod:`~rebaser_server.daemon.reconnect`: what the daemon does after every reconnect to NATS;
- :mod:`~rebaser_server.daemon.owned`: the change sets owned now, each from its task taken to the task's end;
- :mod:`~rebaser_server.daemon.admission`: how many change sets may be in their cold path at once;
- :mod:`~rebaser_server.daemon.startup`: set-up retried while the cluster is still forming, the app's start, and
  stopping a background task within a bound;
- :mod:`~rebaser_server.daemon.puller`, :mod:`~rebaser_server.daemon.shards`: one pull loop per served shard,
  following the cluster's shard layout;
- :mod:`~rebaser_server.daemon.fifo_intake`: the fifo intake's pull loop per shard (the shared consumer, in order);
- :mod:`~rebaser_server.daemon.fair_intake`, :mod:`~rebaser_server.daemon.turns`: the fair intake's loop per shard
  (a consumer per workspace, the workspaces served in turns) and its turns, as pure logic;
  :mod:`~rebaser_server.daemon.newcomers`: a workspace new to the intake checked for work before it gets a consumer
  (:mod:`~rebaser_server.daemon.workspace_consumers`);
  :mod:`~rebaser_server.daemon.fair_intakes`: those of every served shard, together;
- :mod:`~rebaser_server.daemon.sweeper`, :mod:`~rebaser_server.daemon.junk`: the orphan sweep, and messages on
  malformed subjects;
- :mod:`~rebaser_server.daemon.config`: :class:`ServerConfig`, what a daemon process is started with.

May import: everything below it (:mod:`rebaser_server.queries` and down).
"""
