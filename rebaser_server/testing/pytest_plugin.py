"""pytest plugin for applications built on rebaser: a real NATS server and a running daemon with *your* app.

Installed with the package (entry point ``pytest11``, name ``rebaser``): nothing to configure (``-p no:rebaser``
turns it off). It needs pytest only; fixtures are synchronous, so they work with or without pytest-asyncio (or
anyio) in the test run.

Fixtures (all named ``rebaser_*``, so they never collide with a project's own):

``rebaser_nats`` (session)
    URL of an embedded JetStream-enabled ``nats-server`` (127.0.0.1, free port, temporary store), started on
    first use. Override it (a fixture of the same name returning a URL) to test against a NATS of your own.
``rebaser_prefix``
    A fresh subject prefix per test: every test gets its own streams, so tests sharing the server stay apart.
``rebaser_app``
    The application the daemon runs: the ``rebaser_app`` marker's argument, else the ``rebaser_app`` ini
    option, else the built-in snapshot app. The argument is one of

    - ``"module:attr"`` (also the ini option's form), where ``attr`` is an app, or a class or factory making one;
    - a class, instantiated with no arguments: ``pytest.mark.rebaser_app.with_args(MyApp)`` (``with_args``,
      since a mark called with a class or function alone decorates it);
    - a factory, called with no arguments: ``pytest.mark.rebaser_app.with_args(make_app)``;
    - an app: ``pytest.mark.rebaser_app(MyApp())``, used as it is.

    A class, a factory or a string makes a new app for each test; an app object is shared by every test the
    marker applies to (the daemon starts and stops it for each). Or override the fixture.
``rebaser_settings``
    The daemon's :class:`~rebaser_core.settings.Settings`: short periods for tests (released after 0.5 s quiet,
    memory streams), the test's prefix. Override it to change them.
``rebaser_daemon``
    A daemon running ``rebaser_app`` for the test, shut down gracefully after it: a :class:`RebaserTestDaemon`.
    It runs in-process on an event loop of its own (a background thread), so it serves sync and async tests
    alike; ``rebaser_daemon.client()`` is an async client on the test's own loop.
``rebaser_client``
    A :class:`~rebaser_client.SyncRebaserClient` connected to ``rebaser_daemon``.

Example::

    @pytest.mark.rebaser_app("myproject.apps:MyApp")
    def test_apply(rebaser_client):
        reply = rebaser_client.enqueue_updates_with_reply(WorkspacePk.new(), ChangeSetId.new(), [...])
        assert reply.ok

    async def test_async(rebaser_daemon):            # with pytest-asyncio (or anyio) installed
        async with rebaser_daemon.client() as client:
            ...
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

# Only what pytest needs to load the plugin is imported here: it is loaded in every pytest run of an environment
# that has rebaser installed, so rebaser itself (nats-py, the daemon) is imported when a fixture is first used.
if TYPE_CHECKING:
    from rebaser_client import RebaserClient, SyncRebaserClient
    from rebaser_core.nats.connect import ConnectOptions
    from rebaser_core.settings import Settings
    from rebaser_server.app import RebaserApp
    from rebaser_server.daemon.daemon import Daemon

__all__ = ["RebaserTestDaemon"]

_T = TypeVar("_T")
START_TIMEOUT = 60.0  # generous: a loaded CI machine; the daemon's own set-up has deadlines inside this
STOP_TIMEOUT = 60.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "rebaser_app",
        'the application the rebaser_daemon fixture runs, as "module:attr" (default: the built-in snapshot app)',
        default=None,
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        'rebaser_app(app): the application the rebaser_daemon fixture runs: "module:attr", an app, or a class or '
        "factory making one",
    )


class _LoopThread:
    """An event loop on a thread of its own, where the daemons run whatever loop (if any) the tests use."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rebaser-test-daemon", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float) -> _T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        self.run(self._cancel_rest(), timeout=10)
        with contextlib.suppress(TimeoutError):
            self.run(self.loop.shutdown_default_executor(), timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()

    @staticmethod
    async def _cancel_rest() -> None:
        current = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks() if t is not current]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)


@dataclass(frozen=True)
class RebaserTestDaemon:
    """What the ``rebaser_daemon`` fixture gives a test. ``daemon`` runs on another thread: read from it (its
    ``stats``, ``owned``), do not call it."""

    nats_url: str
    prefix: str | None
    settings: Settings
    app: RebaserApp
    daemon: Daemon

    def connect_options(self) -> ConnectOptions:
        from rebaser_core.nats.connect import ConnectOptions

        return ConnectOptions(servers=(self.nats_url,), name="rebaser-pytest")

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[RebaserClient]:
        """An async client on the running loop (the test's), talking to this daemon."""
        from rebaser_client import RebaserClient

        async with await RebaserClient.connect(self.connect_options(), prefix=self.prefix) as client:
            yield client

    def sync_client(self) -> SyncRebaserClient:
        from rebaser_client import SyncRebaserClient

        return SyncRebaserClient(self.connect_options(), prefix=self.prefix)


def _make_app(spec: object, where: str) -> RebaserApp:
    """The app ``spec`` stands for: ``"module:attr"`` (loaded by :func:`~rebaser_server.app.load_app`), a class
    (instantiated with no arguments), an app (used as it is) or a factory (called with no arguments).

    A class is tested before an app: :class:`~rebaser_server.app.RebaserApp` is a runtime-checkable protocol, and a
    class has the methods it checks for, so ``isinstance(MyApp, RebaserApp)`` is true of the class itself.
    """
    from rebaser_server.app import RebaserApp, load_app

    what = f"{spec!r}" if isinstance(spec, str) else f"{spec!r} ({type(spec).__name__})"
    try:
        if isinstance(spec, str):
            app: object = load_app(spec)
        elif isinstance(spec, type):
            app = spec()
        elif isinstance(spec, RebaserApp):
            app = spec
        elif callable(spec):
            app = spec()
        else:
            pytest.fail(
                f"{where}: {what} is not a rebaser app, nor a class or factory making one, nor a 'module:attr' "
                "string",
                pytrace=False,
            )
    except (ImportError, AttributeError, ValueError, TypeError) as err:
        pytest.fail(f"{where}: cannot load {what}: {type(err).__name__}: {err}", pytrace=False)
    if isinstance(app, type) or not isinstance(app, RebaserApp):
        made = "" if app is spec else f" made {app!r} ({type(app).__name__}), which"
        pytest.fail(
            f"{where}: {what}{made} is not a rebaser app (it needs start, stop, initial_state, apply and "
            "dependent_values_update: see rebaser_server/app/contract.py)",
            pytrace=False,
        )
    return app


@pytest.fixture(scope="session")
def rebaser_nats() -> Iterator[str]:
    """URL of an embedded nats-server shared by the session."""
    from rebaser_core.embedded import NatsServer

    # die_with_parent: a test run killed outright takes its server along (fixtures run on the main thread).
    server = NatsServer(die_with_parent=True)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def rebaser_prefix() -> str:
    """A fresh subject prefix for this test (``rt`` + 10 hex digits): streams of its own."""
    return "rt" + secrets.token_hex(5)


@pytest.fixture
def rebaser_app(request: pytest.FixtureRequest) -> RebaserApp:
    """A new app for this test: the ``rebaser_app`` marker's, else the ini option's, else the built-in one."""
    marker = request.node.get_closest_marker("rebaser_app")
    if marker is not None:
        if len(marker.args) != 1 or marker.kwargs:
            pytest.fail("@pytest.mark.rebaser_app takes one argument: the app", pytrace=False)
        return _make_app(marker.args[0], "@pytest.mark.rebaser_app")
    ini = request.config.getini("rebaser_app")
    if ini:
        return _make_app(str(ini).strip(), "ini option rebaser_app")
    from rebaser_server.daemon.config import DEFAULT_APP

    return _make_app(DEFAULT_APP, "the default app")


@pytest.fixture
def rebaser_settings(rebaser_prefix: str) -> Settings:
    """The daemon's settings: periods shrunk for tests, memory streams, this test's prefix."""
    from rebaser_server.testing import fast_settings

    return fast_settings(rebaser_prefix)


@pytest.fixture(scope="session")
def _rebaser_loop() -> Iterator[_LoopThread]:
    """The event loop (on a thread of its own) the session's daemons run on."""
    loop = _LoopThread()
    try:
        yield loop
    finally:
        loop.close()


@pytest.fixture
def rebaser_daemon(
    rebaser_nats: str, rebaser_app: RebaserApp, rebaser_settings: Settings, _rebaser_loop: _LoopThread
) -> Iterator[RebaserTestDaemon]:
    """A daemon running ``rebaser_app`` on ``rebaser_nats`` for this test (in-process, on a thread of its own)."""
    from rebaser_server.testing import running_daemon

    exits: contextlib.AsyncExitStack | None = None

    async def start() -> RebaserTestDaemon:
        nonlocal exits
        import nats

        async with contextlib.AsyncExitStack() as stack:
            nc = await asyncio.wait_for(nats.connect(rebaser_nats, name="rebaser-pytest-daemon"), 10)
            stack.push_async_callback(nc.close)
            daemon = await stack.enter_async_context(running_daemon(nc, rebaser_settings, rebaser_app))
            exits = stack.pop_all()  # stopped by the teardown below
        return RebaserTestDaemon(rebaser_nats, rebaser_settings.prefix, rebaser_settings, rebaser_app, daemon)

    handle = _rebaser_loop.run(start(), START_TIMEOUT)
    try:
        yield handle
    finally:
        assert exits is not None
        _rebaser_loop.run(exits.aclose(), STOP_TIMEOUT)


@pytest.fixture
def rebaser_client(rebaser_daemon: RebaserTestDaemon) -> Iterator[SyncRebaserClient]:
    """A synchronous client of ``rebaser_daemon`` (usable from async tests too: the daemon has its own loop)."""
    with rebaser_daemon.sync_client() as client:
        yield client
