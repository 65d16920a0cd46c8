"""``rebaser-server``: the command line. Flags, the ``--config`` file, signals, and the embedded nats-server.

- :mod:`~rebaser_server.cli.main`: the command and its flags, ``rebaser-server dev-cluster`` among its subcommands;
- :mod:`~rebaser_server.cli.option_groups`: the flags that come in groups (the NATS connection, the embedded
  nats-server, the health endpoint), one decorator each, and the checks of their values;
- :mod:`~rebaser_server.cli.serve`: serving once the flags are read (embedded server, connection, health endpoint,
  daemon) and stopping it all in order;
- :mod:`~rebaser_server.cli.config_file`: ``--config`` TOML and ``REBASER_*`` variables into settings;
- :mod:`~rebaser_server.cli.signals`: SIGTERM, SIGINT and SIGUSR1.

May import: every other package of the server (it is the top layer); nothing imports it.
"""
