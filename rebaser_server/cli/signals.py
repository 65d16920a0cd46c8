"""The daemon's signals: SIGTERM and SIGINT shut it down (a second one exits at once), SIGUSR1 logs where every
coroutine is waiting."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal

from rebaser_server.daemon.daemon import Daemon

__all__ = ["Signals", "dump_tasks", "install_signal_handlers"]

log = logging.getLogger("rebaser_server")


class Signals:
    def __init__(self) -> None:
        self.started = False  # the daemon has started: a signal shuts it down
        self.interrupted_start = False  # a signal came while it was starting: start-up was cancelled


def install_signal_handlers(daemon: Daemon) -> Signals:
    loop = asyncio.get_running_loop()
    serving = asyncio.current_task()
    state = Signals()
    signals_seen = 0
    shutdowns: list[asyncio.Future[None]] = []  # keep a reference so the task is not garbage-collected

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            log.warning("second signal: exiting at once")
            os._exit(1)
        log.info("signal %s: shutting down (again to exit at once)", signal.Signals(signum).name)
        if state.started or serving is None:
            shutdowns.append(asyncio.ensure_future(daemon.shutdown()))
        else:
            # Starting may wait for JetStream for a long time (set-up is retried): interrupt it instead.
            state.interrupted_start = True
            serving.cancel()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    # A daemon that seems stuck explains itself without being stopped: `kill -USR1 PID` logs where every
    # coroutine is waiting.
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    return state


def dump_tasks() -> None:
    """Log every asyncio task of the running loop with its stack (SIGUSR1)."""
    out = io.StringIO()
    tasks = asyncio.all_tasks()
    for task in sorted(tasks, key=lambda t: t.get_name()):
        print(f"---- {task.get_name()}", file=out)
        task.print_stack(limit=20, file=out)
    log.warning("SIGUSR1: %d asyncio tasks\n%s", len(tasks), out.getvalue())
