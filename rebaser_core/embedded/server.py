"""One ``nats-server`` process on loopback (see :class:`NatsServer`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from rebaser_core.embedded.binary import find_nats_server, server_command
from rebaser_core.embedded.net import can_connect, check_loopback, format_host, port_of
from rebaser_core.embedded.process import launch_command
from rebaser_core.embedded.store import StoreGuard
from rebaser_core.errors import EmbeddedServerError
from rebaser_core.nats.durability import check_sync

__all__ = ["NatsServer"]

_LOG_TAIL_LINES = 40


class _Resources:
    """What a :class:`NatsServer` must release even if it is garbage-collected or the interpreter exits."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.runtime_dir: Path | None = None
        self.guard: StoreGuard | None = None

    def release(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5.0)
        if self.guard is not None:
            if proc is None or proc.poll() is not None:
                self.guard.forget_server()
            self.guard.release()
        runtime_dir, self.runtime_dir = self.runtime_dir, None
        if runtime_dir is not None:
            shutil.rmtree(runtime_dir, ignore_errors=True)


class NatsServer:
    """One ``nats-server`` process on loopback.

    ``port`` and ``cluster_port`` default to ports the server picks itself (``-p -1``),
    learnt from its ports file; once learnt they stay fixed, so :meth:`restart` and
    :meth:`start` after :meth:`stop` or :meth:`kill` come back on the same URL.
    With ``store_dir=None`` JetStream data lives in a temporary directory that
    :meth:`stop` removes; the log and the ports file always live in a private temporary
    directory (see :attr:`log_path`). ``port=0`` also means "any free port".

    A ``store_dir`` of your own is guarded (:class:`~rebaser_core.embedded.store.StoreGuard`):
    :meth:`start` takes its lock, or raises :class:`~rebaser_core.errors.StoreInUse` when another
    process holds it, and stops a server an earlier owner left running on it; :meth:`stop` (unless
    ``keep_files``) releases the lock.

    The process runs in its own session, so a terminal's Ctrl-C reaches only its owner, which stops
    it (see :mod:`.process`). With ``die_with_parent`` (Linux) it also gets SIGTERM when the thread
    that started it dies, e.g. its owner is killed with SIGKILL; start it from the main thread.
    It listens on loopback only; ``expose=True`` allows any ``host`` (``0.0.0.0`` in a container).

    ``sync`` is nats-server's ``sync_interval``: ``"always"`` fsyncs every write before it is acknowledged, a
    duration (``"1s"``) fsyncs that often, None keeps the server's default (2 minutes). The HTTP monitoring
    endpoint (``monitoring``, on loopback, :attr:`monitoring_url`) is where that can be read back; its port, like
    the client port, is picked by the server unless ``monitoring_port`` is given, and then kept.
    """

    def __init__(
        self,
        *,
        store_dir: Path | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        jetstream: bool = True,
        cluster_name: str | None = None,
        cluster_port: int | None = None,
        routes: Sequence[str] = (),
        server_name: str | None = None,
        extra_args: Sequence[str] = (),
        binary: Path | None = None,
        die_with_parent: bool = False,
        expose: bool = False,
        sync: str | None = None,
        monitoring: bool = True,
        monitoring_port: int | None = None,
        include: Path | None = None,
    ) -> None:
        # Loopback only unless the caller says otherwise (``expose``): the server has no authentication. A daemon
        # in a container exposes it on 0.0.0.0, where the container's network is the fence.
        self._host = host if expose else check_loopback(host)
        # Where this machine reaches it: a wildcard address is listened on, not connected to.
        self._connect_host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        self._store_dir_arg = Path(store_dir) if store_dir is not None else None
        self._port = port or None
        self._jetstream = jetstream
        self._cluster_name = cluster_name
        self._cluster_port = cluster_port
        self._clustered = cluster_name is not None or cluster_port is not None or bool(routes)
        self._routes = list(routes)
        self._server_name = server_name
        self._extra_args = list(extra_args)
        self._binary = binary
        self._die_with_parent = die_with_parent
        # nats-server's ``sync_interval``: "always" (fsync before every acknowledgement), a duration, or None for
        # the server's default (every 2 minutes). Only a config file can set it, so one is written (_config).
        self._sync = check_sync(sync) if sync is not None else None
        # The monitoring endpoint, always on loopback (it has no authentication either): it is where a daemon reads
        # back the sync setting (rebaser_server.ops.durability), and where an operator looks.
        self._monitoring = monitoring
        self._monitoring_port = monitoring_port or None
        # A configuration file of the operator's (accounts: docs/nats-accounts.conf), included by the one written
        # here: a second -c would replace that one, and with it the sync setting and the monitoring endpoint.
        self._include = Path(include).absolute() if include is not None else None
        self._log_offset = 0
        self._res = _Resources()
        if self._store_dir_arg is not None and jetstream:
            self._res.guard = StoreGuard(self._store_dir_arg)
        self._finalizer = weakref.finalize(self, self._res.release)

    # ----------------------------------------------------------------- properties

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        """The client port. Known once the server was started (or when given explicitly)."""
        if self._port is None:
            raise EmbeddedServerError("the port is not known before the server has been started")
        return self._port

    @property
    def cluster_port(self) -> int | None:
        return self._cluster_port

    @property
    def url(self) -> str:
        return f"nats://{format_host(self._connect_host)}:{self.port}"

    @property
    def cluster_url(self) -> str | None:
        if self._cluster_port is None:
            return None
        return f"nats://{format_host(self._connect_host)}:{self._cluster_port}"

    @property
    def monitoring_url(self) -> str | None:
        """The HTTP monitoring endpoint (``/varz``, ``/healthz``), on loopback; None before the first start or
        without ``monitoring``."""
        if self._monitoring_port is None:
            return None
        return f"http://127.0.0.1:{self._monitoring_port}"

    @property
    def sync(self) -> str | None:
        """The ``sync_interval`` the server is given ("always", a duration), None for the server's default."""
        return self._sync

    @property
    def server_name(self) -> str | None:
        return self._server_name

    @property
    def pid(self) -> int | None:
        """PID of the current process, ``None`` when stopped or killed."""
        proc = self._res.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def running(self) -> bool:
        proc = self._res.proc
        return proc is not None and proc.poll() is None

    @property
    def store_dir(self) -> Path:
        """The JetStream store directory (a temporary one is created on first use)."""
        if self._store_dir_arg is not None:
            return self._store_dir_arg
        return self._runtime_dir() / "store"

    @property
    def log_path(self) -> Path:
        """The file receiving the server's stdout and stderr (removed by :meth:`stop`)."""
        return self._runtime_dir() / "nats-server.log"

    def log_tail(self, lines: int = _LOG_TAIL_LINES, *, since_start: bool = False) -> str:
        """The last ``lines`` lines of the log (optionally only of the latest start)."""
        if self._res.runtime_dir is None:
            return ""
        try:
            with self.log_path.open("rb") as f:
                if since_start:
                    f.seek(self._log_offset)
                data = f.read()
        except OSError:
            return ""
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])

    # ------------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 10.0) -> Self:
        """Spawn the process and wait until it accepts client connections.

        A no-op when already running. Raises :class:`EmbeddedServerError` (with the tail
        of the log) if the process exits early or is not ready within ``timeout`` seconds,
        :class:`~rebaser_core.errors.StoreInUse` if another process guards the store.
        """
        if self.running:
            return self
        self._reap()
        guard = self._res.guard
        took_lock = guard is not None and not guard.held
        if guard is not None:
            guard.acquire()
        try:
            if guard is not None:
                guard.stop_stale_server()
            binary = self._binary or find_nats_server()
            # Ports not given are chosen by the server itself (``-p -1``) and read back from its
            # ports file, so there is no window in which another process could take them.
            self._spawn(binary)
            self._wait_started(time.monotonic() + timeout)
        except BaseException:
            self._reap()
            if took_lock and guard is not None:
                guard.release()
            raise
        return self

    def stop(self, timeout: float = 5.0, *, keep_files: bool = False) -> None:
        """SIGTERM the process, SIGKILL it after ``timeout`` seconds; idempotent.

        Unless ``keep_files`` is true, the private temporary directory (log, ports file,
        and the JetStream store if no ``store_dir`` was given) is removed.
        """
        proc, self._res.proc = self._res.proc, None
        try:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout)
            self._forget_server()
        finally:
            if not keep_files:
                self._res.release()

    def kill(self) -> None:
        """SIGKILL the process right away (simulates a crash); files are kept. Idempotent."""
        proc, self._res.proc = self._res.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._forget_server()

    def restart(self, timeout: float = 10.0) -> Self:
        """Stop (keeping the store) and start again on the same ports."""
        self.stop(keep_files=True)
        return self.start(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        port = self._port if self._port is not None else "?"
        name = f" {self._server_name}" if self._server_name else ""
        return f"<NatsServer{name} {self._host}:{port} {state}>"

    # ------------------------------------------------------------------- internals

    def _runtime_dir(self) -> Path:
        if self._res.runtime_dir is None:
            self._res.runtime_dir = Path(tempfile.mkdtemp(prefix="rebaser-nats-"))
        return self._res.runtime_dir

    def _ports_dir(self) -> Path:
        return self._runtime_dir() / "ports"

    def _command(self, binary: Path) -> list[str]:
        return server_command(
            binary,
            host=self._host,
            port=self._port,
            ports_dir=self._ports_dir(),
            # Absolute, so the next owner recognises a server left on this store whatever its working directory.
            store_dir=self.store_dir.absolute() if self._jetstream else None,
            server_name=self._server_name,
            clustered=self._clustered,
            cluster_port=self._cluster_port,
            cluster_name=self._cluster_name,
            routes=self._routes,
            extra_args=self._extra_args,
            config_file=self._write_config(),
        )

    def _write_config(self) -> Path | None:
        """The config file for what only a config file can set (None: nothing to set)."""
        lines = []
        path = self._runtime_dir() / "nats-server.conf"
        if self._include is not None:
            # nats-server reads an include relative to the including file, even a path that starts with "/".
            lines.append(f'include "{os.path.relpath(self._include, path.parent)}"')
        if self._sync is not None and self._jetstream:
            lines.append(f'jetstream {{\n  sync_interval: "{self._sync}"\n}}')
        if self._monitoring:
            # Learnt once like the client port, so a restarted server keeps its monitoring URL.
            port = self._monitoring_port if self._monitoring_port is not None else -1
            lines.append(f'http: "127.0.0.1:{port}"')
        if not lines:
            return None
        path.write_text("\n".join(lines) + "\n")
        return path

    def _spawn(self, binary: Path) -> None:
        self._ports_dir().mkdir(parents=True, exist_ok=True)
        if self._jetstream:
            self.store_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            try:
                self._res.proc = subprocess.Popen(
                    launch_command(self._command(binary), die_with_parent=self._die_with_parent),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    close_fds=True,  # the store lock's descriptor stays with the owner
                    start_new_session=True,  # see .process: only the owner stops it
                )
            except OSError as exc:
                raise EmbeddedServerError(f"could not run {binary}: {exc}") from exc
        if self._res.guard is not None:
            self._res.guard.record_server(self._res.proc.pid)

    def _read_ports(self, pid: int) -> dict[str, list[str]] | None:
        # nats-server writes ``<executable>_<pid>.ports`` once all its listeners are bound.
        for path in self._ports_dir().glob(f"*_{pid}.ports"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                return None  # not (completely) written yet
            if isinstance(data, dict):
                return {str(k): [str(u) for u in v] for k, v in data.items() if isinstance(v, list)}
        return None

    def _wait_started(self, deadline: float) -> None:
        proc = self._res.proc
        assert proc is not None
        while True:
            code = proc.poll()
            if code is not None:
                raise EmbeddedServerError(
                    f"nats-server exited with code {code} during startup; log tail:\n"
                    + self.log_tail(since_start=True)
                )
            ports = self._read_ports(proc.pid)
            if ports is not None:
                client = [p for p in map(port_of, ports.get("nats", [])) if p]
                cluster = [p for p in map(port_of, ports.get("cluster", [])) if p]
                monitor = [p for p in map(port_of, ports.get("monitoring", [])) if p]
                # The ports file is written once every listener is bound, so a monitoring port is in it or not there
                # at all (extra_args with a config file of the caller's own may have replaced ours).
                listening = bool(client) and (bool(cluster) or not self._clustered)
                if listening and can_connect(self._connect_host, client[0]) and proc.poll() is None:
                    self._port = client[0]
                    if monitor:
                        self._monitoring_port = monitor[0]
                    if self._clustered:
                        self._cluster_port = cluster[0]
                    return
            if time.monotonic() >= deadline:
                proc.kill()
                proc.wait()
                raise EmbeddedServerError(
                    "nats-server did not become ready in time; log tail:\n" + self.log_tail(since_start=True)
                )
            time.sleep(0.01)

    def _reap(self) -> None:
        """Forget a process that has exited (crashed or killed); kill it if it has not."""
        proc, self._res.proc = self._res.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            self._forget_server()

    def _forget_server(self) -> None:
        if self._res.guard is not None:
            self._res.guard.forget_server()

    def _terminate_nowait(self) -> None:
        proc = self._res.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
