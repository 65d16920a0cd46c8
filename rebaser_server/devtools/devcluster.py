"""``rebaser-server dev-cluster``: the topology of docker-compose.yml as local processes, for machines without Docker.

Three nats-server nodes routed into one JetStream cluster (:class:`~rebaser_core.embedded.NatsCluster`, streams
replicated three times) and N daemon processes (``python -m rebaser_server``) on them, all on 127.0.0.1; with
``--demo``, a steady demo load (:mod:`rebaser_server.devtools.devload`). A daemon that dies is started again,
as compose's
restart policy would. What it runs (URLs, PIDs, health endpoints, logs) is printed and kept in ``status.json``.

It stops everything it started, by PID: on SIGTERM or Ctrl-C the daemons get SIGTERM (so they hand their change
sets back while NATS is still up), then the NATS nodes are stopped; whatever still runs at the deadline is
SIGKILLed. A second signal SIGKILLs everything at once. Every child runs in a session of its own (a terminal's
Ctrl-C reaches only this process, which stops them in that order) and gets SIGTERM from the kernel if this process
is killed outright (``PR_SET_PDEATHSIG``, Linux), so none is left behind.

The command, its options and the signals' handling are :mod:`rebaser_server.devtools.devcluster_command`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from rebaser_core.embedded import NatsCluster
from rebaser_core.embedded.process import launch_command
from rebaser_core.nats import cancellation
from rebaser_core.nats.durability import describe_sync
from rebaser_server.devtools.embedded_start import start_embedded

__all__ = ["DevCluster"]

NODES = 3  # as docker-compose.yml: three nodes, so R3 streams survive the loss of one
CLUSTER_NAME = "rebaser-dev"
_SERVING = b"rebaser daemon serving"
_HEALTH = re.compile(rb"health endpoint on (http://\S+)")
_RESTART_DELAY, _RESTART_DELAY_MAX = 1.0, 30.0
# The daemons' user of docs/nats-accounts.conf, for --accounts; another with --daemon-user and --daemon-password.
DAEMON_CREDENTIALS = ("rebaser-daemon", "change-me-daemon")
_STABLE = 30.0  # a daemon that ran this long before dying is restarted after the short delay again


@dataclass
class _Slot:
    """One daemon of the cluster, across its restarts."""

    index: int
    log: Path
    http_port: int  # as asked for (0: any free port, learnt from its log)
    proc: asyncio.subprocess.Process | None = None
    http_url: str | None = None
    restarts: int = 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


def _exit_reason(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class DevCluster:
    """The processes of one dev cluster. Start and stop them on the main thread (its event loop's): the children's
    parent-death signal follows the thread that started them."""

    def __init__(
        self,
        *,
        daemons: int,
        app: str,
        data_dir: Path | None,
        nats_port: int,
        http_port: int,
        stop_timeout: float,
        sync: str | None = "always",
        accounts: Path | None = None,
        daemon_credentials: tuple[str, str] = DAEMON_CREDENTIALS,
        echo: Callable[[str], None] = click.echo,
    ) -> None:
        self._temporary = data_dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="rebaser-dev-")) if data_dir is None else data_dir.absolute()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.status_path = self.dir / "status.json"
        self._app = app
        self._stop_timeout = stop_timeout
        self._echo = echo
        # With an accounts configuration (docs/nats-accounts.conf) every node loads it, and the daemons connect as
        # the daemons' user of it; callers connect as users of their own accounts.
        self.accounts = accounts.absolute() if accounts is not None else None
        self._credentials = daemon_credentials if accounts is not None else None
        self.nats = NatsCluster(
            NODES,
            base_dir=self.dir / "nats",
            cluster_name=CLUSTER_NAME,
            client_ports=[nats_port + i if nats_port else 0 for i in range(NODES)],
            die_with_parent=True,
            sync=sync,
            include=self.accounts,
            credentials=self._credentials,
        )
        self.slots = [
            _Slot(i, self.dir / f"daemon-{i}.log", http_port + i - 1 if http_port else 0)
            for i in range(1, daemons + 1)
        ]
        self._supervisors: list[asyncio.Task[None]] = []
        self._nats_started = False  # until then the status file (maybe another dev cluster's) is not ours

    # -- start ------------------------------------------------------------------------------------------------
    def start_nats(self) -> None:
        start_embedded(
            lambda: self.nats.start(timeout=60),
            in_use=f"data directory {self.dir} is in use by another dev cluster{{holder}}; stop it, or pass another "
            "--data-dir",
            port_taken="a NATS port is taken; choose others with --nats-port N (0: any free ports)",
        )
        self._nats_started = True

    async def start_daemons(self) -> None:
        starting = [asyncio.create_task(self._start_daemon(slot)) for slot in self.slots]
        try:
            await asyncio.gather(*starting)
        except BaseException:
            for task in starting:  # one failed: the others need not wait for their deadline
                task.cancel()
            await asyncio.gather(*starting, return_exceptions=True)
            raise
        self._supervisors = [asyncio.create_task(self._supervise(slot)) for slot in self.slots]
        self.write_status("running")

    def _daemon_command(self, slot: _Slot) -> list[str]:
        urls = [arg for url in self.nats.urls for arg in ("--nats-url", url)]
        # Every node's monitoring endpoint: the daemons check what the nodes promise (durability on /status).
        monitors = [
            arg
            for n in self.nats.nodes
            if n.monitoring_url
            for arg in ("--nats-monitoring-url", n.monitoring_url)
        ]
        return [
            *(sys.executable, "-m", "rebaser_server", *urls, *monitors, "--app", self._app),
            *("--http-host", "127.0.0.1", "--http-port", str(slot.http_port), "--log-format", "console"),
        ]

    async def _start_daemon(self, slot: _Slot, timeout: float = 60.0) -> None:
        env = {**os.environ, "REBASER_REPLICAS": str(NODES), "PYTHONUNBUFFERED": "1"}
        env.pop("REBASER_NATS_URL", None)  # --nats-url is given; the variable would only confuse a reader
        if self._credentials is not None:  # in the environment, not on the command line (ps shows that)
            env["REBASER_NATS_USER"], env["REBASER_NATS_PASSWORD"] = self._credentials
        env.setdefault("OTEL_SERVICE_NAME", f"rebaser-dev-{slot.index}")
        with slot.log.open("ab") as out:
            offset = out.tell()
            slot.proc = await asyncio.create_subprocess_exec(
                *launch_command(self._daemon_command(slot), die_with_parent=True),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        slot.http_url = None
        deadline = time.monotonic() + timeout
        while True:  # the daemon says when it serves, and where its health endpoint is, on its stdout
            with slot.log.open("rb") as f:
                f.seek(offset)
                text = f.read()
            if _SERVING in text:
                found = _HEALTH.search(text)
                slot.http_url = found.group(1).decode() if found else None
                return
            if slot.proc.returncode is not None or time.monotonic() > deadline:
                if slot.proc.returncode is None:
                    slot.proc.kill()
                    await slot.proc.wait()
                tail = "\n".join(text.decode(errors="replace").splitlines()[-15:])
                raise click.ClickException(f"daemon {slot.index} did not start ({slot.log}):\n{tail}")
            await asyncio.sleep(0.1)

    async def _supervise(self, slot: _Slot) -> None:
        """Start the daemon again whenever it dies (waiting longer each time it dies soon after starting)."""
        delay = _RESTART_DELAY
        while True:
            assert slot.proc is not None
            started, pid = time.monotonic(), slot.proc.pid
            code = await slot.proc.wait()
            slot.http_url = None
            delay = _RESTART_DELAY if time.monotonic() - started > _STABLE else delay
            self._echo(
                f"daemon {slot.index} (pid {pid}) {_exit_reason(code)}; starting it again in {delay:.0f} s"
            )
            self.write_status("running")
            await cancellation.sleep(delay)
            delay = min(delay * 2, _RESTART_DELAY_MAX)
            slot.restarts += 1
            try:
                await self._start_daemon(slot)
            except click.ClickException as err:
                self._echo(err.format_message())
                continue
            self._echo(f"daemon {slot.index} serving again: {self._describe(slot)}")
            self.write_status("running")

    @property
    def load_urls(self) -> list[str]:
        """The nodes' URLs for the demo load, with the daemons' user when the nodes have accounts (the load stands in
        for an operator's traffic, from the daemons' account)."""
        if self._credentials is None:
            return self.nats.urls
        user, password = self._credentials
        return [url.replace("nats://", f"nats://{user}:{password}@", 1) for url in self.nats.urls]

    # -- what runs --------------------------------------------------------------------------------------------
    @staticmethod
    def _describe(slot: _Slot) -> str:
        assert slot.proc is not None
        return f"pid {slot.proc.pid}, {slot.http_url or 'no health endpoint'}, log {slot.log}"

    def announce(self) -> None:
        kept = "removed at exit" if self._temporary else "kept"
        self._echo(
            f"rebaser dev cluster: {NODES} NATS nodes, {len(self.slots)} daemons; files in {self.dir} ({kept})"
        )
        sync = describe_sync(self.nats.nodes[0].sync)
        for node in self.nats.nodes:
            self._echo(
                f"  nats-server {node.server_name}: {node.url} (pid {node.pid}, {sync}, monitor {node.monitoring_url})"
            )
        for slot in self.slots:
            self._echo(f"  daemon {slot.index}: {self._describe(slot)}")
        if self.accounts is not None:
            self._echo(
                f"  accounts: {self.accounts}; callers connect as its users, each with its own inbox prefix "
                "(docs/accounts.md), e.g. REBASER_NATS_URL=nats://client-1:change-me-client-1@<node> and "
                "inbox_prefix _INBOX.client-1"
            )
        self._echo(
            f"Point a client at it (any node will do; it learns the others):\n"
            f"  export REBASER_NATS_URL={self.nats.urls[0]}\n"
            f"  rebaser request --workspace $(rebaser new-id) --change-set $(rebaser new-id) --set /a=1"
        )
        self._echo(f"Status as JSON in {self.status_path}. Ctrl-C (or SIGTERM) stops everything.")

    def write_status(self, state: str) -> None:
        status = {
            "state": state,
            "pid": os.getpid(),
            "nats": [{"name": n.server_name, "url": n.url, "pid": n.pid} for n in self.nats.nodes],
            "client_url": self.nats.urls[0],
            "accounts": str(self.accounts) if self.accounts is not None else None,
            "daemons": [
                {
                    "index": s.index,
                    "pid": s.proc.pid if s.running and s.proc else None,
                    "http_url": s.http_url,
                    "log": str(s.log),
                    "restarts": s.restarts,
                }
                for s in self.slots
            ],
        }
        partial = self.status_path.with_suffix(".tmp")
        partial.write_text(json.dumps(status, indent=2) + "\n")
        partial.replace(self.status_path)  # readers never see half a file

    # -- stop -------------------------------------------------------------------------------------------------
    async def stop(self) -> None:
        """SIGTERM the daemons, wait for them (SIGKILL at the deadline), then stop the NATS nodes."""
        for task in self._supervisors:
            task.cancel()  # no restarts from here on
        await asyncio.gather(*self._supervisors, return_exceptions=True)
        if self._nats_started:
            self._echo("stopping: daemons first (they hand their change sets back), then NATS")
        procs = [s.proc for s in self.slots if s.proc is not None and s.proc.returncode is None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(self._stop_timeout):
                await asyncio.gather(*(p.wait() for p in procs))
        except TimeoutError:
            for proc in procs:
                if proc.returncode is None:
                    self._echo(
                        f"daemon pid {proc.pid} still running after {self._stop_timeout:.0f} s: SIGKILL"
                    )
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            async with asyncio.timeout(10):
                await asyncio.gather(*(p.wait() for p in procs))
        self.nats.stop(timeout=10)  # SIGKILLs a node that does not stop in time
        self._finish("stopped")
        if self._nats_started:
            self._echo("dev cluster stopped")

    def kill_now(self) -> None:
        """SIGKILL every child at once (a second signal: the operator does not want to wait)."""
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.kill()
        for node in self.nats.nodes:
            node.kill()
        self._finish("killed")

    def _finish(self, state: str) -> None:
        if self._temporary:
            shutil.rmtree(self.dir, ignore_errors=True)
        elif self._nats_started:
            self.write_status(state)
