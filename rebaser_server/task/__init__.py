"""Owning a task delivery: the lease on it, keeping it alive, handing it back.

A daemon owns a change set for as long as it holds that change set's task delivery from the shared tasks
consumer. This package owns everything about that hold, with no notion of what the change set contains:

- :mod:`~rebaser_server.task.delivery`: what a JetStream delivery's ack subject says (sequences, pending);
- :mod:`~rebaser_server.task.lease`: how long the delivery is ours, from confirmed progress acks;
- :mod:`~rebaser_server.task.keeper`: one loop per daemon that renews every lease and runs the watchdogs;
- :mod:`~rebaser_server.task.handback`: nacks that nats-server stores and confirms.

May import: ``rebaser_core`` and nats-py only.
"""
