"""Developer tooling: the demo, the local dev cluster and its load. Not needed to run a daemon in production.

- :mod:`~rebaser_server.devtools.demo`: ``rebaser-server --demo`` traffic;
- :mod:`~rebaser_server.devtools.devcluster`, :mod:`~rebaser_server.devtools.devload`: ``rebaser-server
  dev-cluster``, three nats-server nodes and N daemons on 127.0.0.1, and its demo load;
  :mod:`~rebaser_server.devtools.devcluster_command`: the command, its options, and its run until a signal;
- :mod:`~rebaser_server.devtools.embedded_start`: starting an embedded NATS with the usual mistakes as one line.

May import: :mod:`rebaser_server.daemon` and everything below it, and ``rebaser_client`` (the demo is a client).
"""
