"""pytest plugin: real NATS servers for tests, plus a deadline-based polling helper.

This project's own test fixtures: load it with ``pytest_plugins = ["rebaser_core.testing"]`` in a ``conftest.py``
or ``-p rebaser_core.testing``. (Applications' tests get ``rebaser_*`` fixtures from the plugin that is installed
with the package, :mod:`rebaser_server.testing.pytest_plugin`.) It sits at the top of rebaser_core: it may import
the rest of it (it starts embedded servers), and nothing in rebaser_core imports it.

Fixtures:

``nats_server`` (session)
    One JetStream-enabled :class:`~rebaser_core.embedded.NatsServer` for the whole session.
``nats_url``
    ``nats_server.url``.
``subject_prefix``
    A fresh prefix per test (``t`` + 10 hex digits): letters and digits only, so it is safe in
    subject tokens and stream names. Use it to keep tests sharing a server apart.
``nats_cluster`` (session, created on first use)
    A 3-node :class:`~rebaser_core.embedded.NatsCluster`.

Wait on conditions, never sleep for a fixed time::

    await wait_for(lambda: len(received) == 3, message="three messages delivered")
"""

from __future__ import annotations

import asyncio
import inspect
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar, overload

import pytest

from rebaser_core.embedded import NatsCluster, NatsServer

__all__ = [
    "CHROMIUM",
    "HEADLESS_CHROMIUM_ARGS",
    "nats_cluster",
    "nats_server",
    "nats_url",
    "subject_prefix",
    "wait_for",
]

_T = TypeVar("_T")

# Debian's chromium, as the browser tests and the console's benchmark start it: headless, as root (no sandbox), and
# quiet on a closed network (without the background-networking flags it keeps calling Google's hosts, refused).
CHROMIUM = "/usr/bin/chromium"
HEADLESS_CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@overload
async def wait_for(
    predicate: Callable[[], Awaitable[_T]],
    timeout: float = ...,
    interval: float = ...,
    message: str = ...,
    *,
    retry_on: tuple[type[BaseException], ...] = ...,
) -> _T: ...


@overload
async def wait_for(
    predicate: Callable[[], _T],
    timeout: float = ...,
    interval: float = ...,
    message: str = ...,
    *,
    retry_on: tuple[type[BaseException], ...] = ...,
) -> _T: ...


async def wait_for(
    predicate: Callable[[], object],
    timeout: float = 10.0,
    interval: float = 0.01,
    message: str = "condition was not met in time",
    *,
    retry_on: tuple[type[BaseException], ...] = (),
) -> object:
    """Poll ``predicate`` (sync or async) until it returns something truthy, and return that.

    Raises ``AssertionError(message)`` once ``timeout`` seconds have passed (the predicate is
    always evaluated at least once, and once more at the deadline). Exceptions of the types
    in ``retry_on`` count as "not yet"; the last one is chained to the ``AssertionError``.
    Any other exception propagates at once.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
        except retry_on as exc:
            last_error = exc
        else:
            if result:
                return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(message) from last_error
        await asyncio.sleep(min(interval, remaining))


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    """A JetStream-enabled nats-server shared by the whole test session."""
    server = NatsServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest.fixture
def subject_prefix() -> str:
    """A unique ``t`` + 10 hex digits prefix for this test's subjects and stream names."""
    return "t" + secrets.token_hex(5)


@pytest.fixture(scope="session")
def nats_cluster() -> Iterator[NatsCluster]:
    """A 3-node JetStream cluster shared by the session; only started if a test asks for it.

    Tests that kill or stop nodes must start them again (``start_node``) before they finish.
    """
    cluster = NatsCluster(3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
