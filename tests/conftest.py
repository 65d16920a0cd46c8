import asyncio
import gc
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TextIO

import nats
import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient
from rebaser_core.embedded import NatsServer

pytest_plugins = ["rebaser_core.testing"]


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NatsClient]:
    conn = await nats.connect(nats_url)
    yield conn
    async with asyncio.timeout(10):  # every await in a test is bounded
        await conn.close()


@pytest.fixture
async def client(nc: NatsClient, subject_prefix: str) -> AsyncIterator[RebaserClient]:
    async with RebaserClient(nc, prefix=subject_prefix) as c:
        yield c


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A server of the test's own (file store in tmp_path), for tests that stop and restart NATS."""
    server = NatsServer(store_dir=tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


# -- a test that overruns its timeout explains itself ----------------------------------------------------------
# pytest-timeout's signal method dumps thread stacks only; every test here waits inside one asyncio event loop, so
# what matters is which coroutines are stuck where. The SIGALRM handler runs on the main thread, inside the running
# loop, so asyncio.all_tasks() sees them.
@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if settings.method != "signal":
        return None
    import signal

    from pytest_timeout import timeout_sigalrm

    def handler(signum: int, frame: Any) -> None:
        __tracebackhide__ = True
        dump_asyncio_tasks(sys.stderr)
        timeout_sigalrm(item, settings)

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # type: ignore[attr-defined]
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


def dump_asyncio_tasks(out: TextIO) -> None:
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:
        return  # no running loop: a synchronous test
    print(f"\n==== {len(tasks)} asyncio tasks at timeout ====", file=out)
    for task in tasks:
        print(f"---- {task.get_name()}: {task!r:.300}", file=out)
        task.print_stack(limit=30, file=out)
    out.flush()


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """The cycle collector off for the test: what it frees must be freed by reference counting alone."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# -- the long tests spread over the workers ------------------------------------------------------------------------
# pytest-xdist (--dist worksteal, the Makefile's) gives each worker one contiguous share of the collection, and a
# worker steals only tests not yet started. The chaos smoke runs (about 30 s each, mostly waiting) come first and
# together, so one worker ran all of them one after another: 259 s against the others' 240 s. Spread evenly through
# the collection, each worker's share holds one or two. The order is the same in every worker (xdist requires it).
_SPREAD = ("tests/chaos/",)


@pytest.hookimpl(trylast=True)  # after -m has deselected the long runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spread = [item for item in items if item.nodeid.startswith(_SPREAD)]
    rest = [item for item in items if not item.nodeid.startswith(_SPREAD)]
    if not spread or not rest:
        return
    step = len(rest) / len(spread)
    ordered: list[pytest.Item] = []
    taken = 0
    for index, item in enumerate(spread):
        upto = round(index * step + step / 2)
        ordered.extend(rest[taken:upto])
        taken = upto
        ordered.append(item)
    ordered.extend(rest[taken:])
    items[:] = ordered
