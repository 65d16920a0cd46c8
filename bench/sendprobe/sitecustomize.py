"""Socket sends, receives and event-loop passes per second of every Python process of a benchmark run.

Run a benchmark with this directory first on ``PYTHONPATH`` and ``BENCH_SEND_STATS`` naming a directory, e.g.::

    mkdir -p /tmp/sends && BENCH_SEND_STATS=/tmp/sends PYTHONPATH=bench/sendprobe \\
        python bench/bench.py --impl baseline,rebaser --daemons 1 --change-sets 1000 --requests 40000 \\
        --burst 0 --dvu-requests 0

Python imports this module at start-up in the benchmark (the client) and in every daemon or worker it starts
(they inherit ``PYTHONPATH``). Each process then appends, once a second, ``<unix time> <sends> <receives>
<event-loop passes>`` (running totals) to ``$BENCH_SEND_STATS/<pid>``; the first line names the process. Differences
of successive lines, set against the requests per second of the scenario that ran then, give sends per request.
Without the variable it does nothing. (``/proc/<pid>/io`` counts only ``read``/``write``, not the ``send``/``recv``
asyncio uses.)
"""

from __future__ import annotations

import asyncio.base_events
import os
import socket
import sys
import threading
import time
from typing import Any

_DIR = os.environ.get("BENCH_SEND_STATS")


def _install(directory: str) -> None:
    counts = {"send": 0, "recv": 0, "passes": 0}
    send, recv = socket.socket.send, socket.socket.recv
    run_once = asyncio.base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]

    def counted_send(self: socket.socket, *args: Any, **kwargs: Any) -> int:
        counts["send"] += 1
        return send(self, *args, **kwargs)

    def counted_recv(self: socket.socket, *args: Any, **kwargs: Any) -> bytes:
        counts["recv"] += 1
        return recv(self, *args, **kwargs)

    def counted_pass(self: Any) -> None:
        counts["passes"] += 1
        run_once(self)

    socket.socket.send = counted_send  # type: ignore[method-assign]
    socket.socket.recv = counted_recv  # type: ignore[method-assign]
    asyncio.base_events.BaseEventLoop._run_once = counted_pass  # type: ignore[attr-defined]

    def dump() -> None:
        with open(os.path.join(directory, str(os.getpid())), "a") as out:
            out.write(f"# {' '.join(sys.orig_argv)}\n")
            while True:
                out.write(f"{time.time():.2f} {counts['send']} {counts['recv']} {counts['passes']}\n")
                out.flush()
                time.sleep(1)

    threading.Thread(target=dump, name="send probe", daemon=True).start()


if _DIR:
    _install(_DIR)
