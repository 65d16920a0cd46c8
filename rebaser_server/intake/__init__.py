"""The intake: how tasks reach a daemon, which workspace's task it takes next, and how many it takes at once.

A daemon takes tasks through one intake per served shard, as the layout names it (docs/fair-share.md). This package
owns everything up to the moment a task is handed to the owned change sets, and nothing after it:

- :mod:`~rebaser_server.intake.lane_intake`: the lanes intake of one shard (the default: the workspaces hashed onto
  a fixed number of lanes, a pull waiting on each lane's consumer);
- :mod:`~rebaser_server.intake.fifo_intake`: the fifo intake's pull loop of one shard (the shared consumer, the
  tasks in the order they came);
- :mod:`~rebaser_server.intake.fair_intake`: the fair intake's loop of one shard (a consumer per workspace, the
  workspaces served in turns), :mod:`~rebaser_server.intake.fair_intakes` those (and the lanes') of every served
  shard, together;
- :mod:`~rebaser_server.intake.fair_line`: which workspaces wait for a turn in the fair intake (a task's publish
  heard, the stream's subjects read, a task handed back): the line its loop serves;
- :mod:`~rebaser_server.intake.turns`: which workspace's turn is next and how large, as pure logic;
- :mod:`~rebaser_server.intake.newcomers`: a workspace new to the fair intake checked for work before it gets a
  consumer (:mod:`~rebaser_server.intake.workspace_consumers`), a made-up one's tasks purged untaken;
- :mod:`~rebaser_server.intake.fairness`: each workspace's share of a daemon's slots, and the share it is served;
- :mod:`~rebaser_server.intake.admission`: how many change sets may be in their cold path at once;
- :mod:`~rebaser_server.intake.puller`: pulling tasks in batches, each handed out the moment it arrives;
- :mod:`~rebaser_server.intake.owner`: :class:`~rebaser_server.intake.owner.Owner`, what the intake reads of the
  change sets owned and how it hands them a task: a small Protocol, so the intake never imports the daemon.

What is done with a task taken (owning it, running its change set, acking or handing it back) is the daemon's
(:mod:`rebaser_server.daemon.owned`) and below.

May import: ``rebaser_core``, nats-py, :mod:`rebaser_server.changeset` (the shared context, the give-way rule),
:mod:`rebaser_server.ops`, :mod:`rebaser_server.task` and what they import; never :mod:`rebaser_server.daemon` nor
:mod:`rebaser_server.queries`.
"""
