"""A loopback cluster of ``nats-server`` nodes (see :class:`NatsCluster`), and the JetStream readiness probe."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import secrets
import time
from collections.abc import Coroutine, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import nats
import nats.js.api

from rebaser_core.embedded.net import ADDR_IN_USE, check_loopback, format_host, free_ports
from rebaser_core.embedded.server import NatsServer
from rebaser_core.errors import EmbeddedServerError

__all__ = ["NatsCluster"]

_CLUSTER_START_ATTEMPTS = 3
_T = TypeVar("_T")


def _run_blocking(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to completion, also when called from inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rebaser-nats") as pool:
        return pool.submit(asyncio.run, coro).result()


async def _ignore_error(_exc: Exception) -> None:
    return None


async def _jetstream_ready(
    url: str, probe_replicas: int = 0, credentials: tuple[str, str] | None = None
) -> bool:
    """True if the server at ``url`` answers JetStream API requests (it knows the meta leader).

    With ``probe_replicas`` > 1 it also creates and deletes a throw-away in-memory stream with
    that many replicas, which proves the cluster can place replicated assets.
    """
    try:
        user, password = credentials or (None, None)
        nc = await nats.connect(
            servers=[url],
            user=user,
            password=password,
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

    Nodes get distinct client ports (``client_ports``, 0 or none: any free one), cluster ports, store
    directories (under ``base_dir`` when given, else temporary) and server names ``<cluster_name>-<i>``.
    ``die_with_parent`` and ``sync``: see :class:`NatsServer` (start the cluster from the main thread then).
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
        client_ports: Sequence[int] | None = None,
        die_with_parent: bool = False,
        sync: str | None = None,
        credentials: tuple[str, str] | None = None,
        include: Path | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        if client_ports is not None and len(client_ports) != size:
            raise ValueError(f"client_ports names {len(client_ports)} ports for {size} nodes")
        self._client_ports = list(client_ports) if client_ports is not None else [0] * size
        self._die_with_parent = die_with_parent
        self._sync = sync
        self._size = size
        self._base_dir = Path(base_dir) if base_dir is not None else None
        self._name = cluster_name or f"rebaser-{secrets.token_hex(3)}"
        self._host = check_loopback(host)
        self._extra_args = list(extra_args)
        # A user and password the readiness probe connects with, for nodes whose configuration (include) has
        # accounts: a connection without them is refused then.
        self._credentials = credentials
        self._include = include  # a configuration every node includes (NatsServer's include)
        self._binary = binary
        self._started_once = False
        self._nodes = self._build_nodes()

    def _build_nodes(self) -> list[NatsServer]:
        # Routes must name the peers' cluster ports up front, so those are picked here;
        # client ports not given are left to the servers (``-p -1``).
        cluster_ports = free_ports(self._size, self._host)
        host = format_host(self._host)
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
                    include=self._include,
                    binary=self._binary,
                    port=self._client_ports[i],
                    die_with_parent=self._die_with_parent,
                    sync=self._sync,
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
                if attempt == attempts or ADDR_IN_USE not in str(exc) or time.monotonic() >= deadline:
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
            pending = [
                i
                for i in pending
                if not await _jetstream_ready(self._nodes[i].url, credentials=self._credentials)
            ]
            if pending:
                if time.monotonic() >= deadline:
                    raise EmbeddedServerError(self._not_ready_message(pending))
                await asyncio.sleep(0.05)
        running = [n for n in self._nodes if n.running]
        if nodes is None and len(running) == self._size and self._size > 1:
            while not await _jetstream_ready(
                running[0].url, probe_replicas=self._size, credentials=self._credentials
            ):
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
