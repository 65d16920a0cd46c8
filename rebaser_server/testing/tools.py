"""Testing tools (public API): force interleavings at named checkpoints and run daemons in-process.

A race is proven by forcing it, not by sleeping and hoping::

    gate = CheckpointGate("stopped_consuming")
    async with running_daemon(nc, settings, app, hooks=gate):
        ...                       # make the daemon quiesce
        await gate.wait_reached()  # it is paused between "stopped consuming" and "task acked"
        ...                       # act inside the window
        gate.release()
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from nats.aio.client import Client as NatsClient

from rebaser_core.nats.bucket_watch import bucket_keys
from rebaser_core.nats.connect import connection_state
from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSet, RebaserApp
from rebaser_server.changeset.hooks import CHECKPOINTS, Hooks
from rebaser_server.daemon.daemon import Daemon
from rebaser_server.record.model import ChangeSetRecord

__all__ = ["CheckpointGate", "RecordingHooks", "describe_state", "fast_settings", "running_daemon"]

log = logging.getLogger(__name__)


def _known(name: str) -> str:
    if name not in CHECKPOINTS:
        raise ValueError(f"unknown checkpoint {name!r}; known: {', '.join(CHECKPOINTS)}")
    return name


class CheckpointGate(Hooks):
    """Pauses the daemon the next time it reaches checkpoint ``name``, until :meth:`release`.

    ``arm()`` makes it pause once more (for loops that force the same interleaving many times).
    """

    def __init__(self, name: str) -> None:
        self.name = _known(name)
        self.change_set: ChangeSet | None = None
        self._armed = True
        self._reached = asyncio.Event()
        self._released = asyncio.Event()

    def arm(self, name: str | None = None) -> None:
        """Pause once more, at ``name`` if given (else at the same checkpoint)."""
        if name is not None:
            self.name = _known(name)
        self._armed = True
        self._reached.clear()
        self._released.clear()

    async def wait_reached(self, timeout: float = 10.0) -> ChangeSet:
        async with asyncio.timeout(timeout):
            await self._reached.wait()
        assert self.change_set is not None
        return self.change_set

    def release(self) -> None:
        self._released.set()

    async def checkpoint(self, name: str, change_set: ChangeSet) -> None:
        if name == self.name and self._armed:
            self._armed = False
            self.change_set = change_set
            self._reached.set()
            await self._released.wait()


class RecordingHooks(Hooks):
    """Records every checkpoint reached, in order, as ``(name, change_set)``."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ChangeSet]] = []

    async def checkpoint(self, name: str, change_set: ChangeSet) -> None:
        self.events.append((name, change_set))

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.events if n == name)


def fast_settings(prefix: str | None, **overrides: object) -> Settings:
    """Settings with periods shrunk for tests (quiet after 0.5 s, ack_wait 3 s, sweep every 1 s), small dead-letter
    streams, 4 lanes."""
    values: dict[str, object] = {
        "prefix": prefix,
        "storage": "memory",
        "ack_wait": 3.0,
        "progress_period": 0.5,
        "quiescent_period": 0.5,
        "handler_deadline": 10.0,
        "sweep_interval": 1.0,
        "retry_backoff": 0.1,
        "retry_backoff_max": 0.5,
        "shutdown_grace": 5.0,
        # Memory streams reserve their max_bytes from the server's JetStream memory up front: at the production 256
        # MiB, a session's server (one deployment per test) runs out ("insufficient memory resources available",
        # err_code 10028) after some 60 tests with daemons.
        "dead_letter_max_bytes": 8 * 1024 * 1024,
        # A test's deployment makes 4 lane consumers, not 32 (each daemon keeps a pull waiting on every lane).
        "lanes": 4,
    }
    values.update(overrides)
    return Settings.model_validate(values)


@asynccontextmanager
async def running_daemon(
    nc: NatsClient,
    settings: Settings,
    app: RebaserApp,
    *,
    hooks: Hooks | None = None,
    sweep: bool = True,
    start_timeout: float = 30.0,
    stop_timeout: float = 45.0,
) -> AsyncIterator[Daemon]:
    """A started in-process daemon, shut down gracefully on exit.

    Start and stop each have a deadline. If either expires, or the body raises, what JetStream holds for this
    deployment (see :func:`describe_state`) is logged, so a rare failure explains itself.
    """
    daemon = Daemon(nc, settings, app, hooks=hooks, sweep=sweep)
    try:
        async with asyncio.timeout(start_timeout):
            await daemon.start(timeout=start_timeout)
    except TimeoutError:
        await _explain(nc, settings, f"daemon did not start within {start_timeout}s")
        await daemon.shutdown()
        raise AssertionError(f"daemon did not start within {start_timeout}s") from None
    try:
        yield daemon
    except BaseException as err:
        await _explain(nc, settings, f"test failed with the daemon running: {type(err).__name__}: {err}")
        raise
    finally:
        # A second before the deadline, where every task stands (the shutdown still waiting: it names the call).
        dump = asyncio.get_running_loop().call_later(max(0.0, stop_timeout - 1.0), _log_tasks)
        try:
            # In a task of its own, so the dump can follow what it awaits.
            await asyncio.wait_for(asyncio.ensure_future(daemon.shutdown()), stop_timeout)
        except TimeoutError:
            await _explain(nc, settings, f"daemon did not stop within {stop_timeout}s")
            raise AssertionError(f"daemon did not stop within {stop_timeout}s") from None
        finally:
            dump.cancel()


def _log_tasks() -> None:
    """Where every task of the loop stands (a shutdown that hangs explains itself)."""
    for task in asyncio.all_tasks():
        chain: list[str] = []
        awaited: Any = task.get_coro()
        while awaited is not None and len(chain) < 20:  # the coroutines it awaits, outermost first
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
            if frame is not None:
                chain.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
        log.error("task %s: %s", task.get_name(), " -> ".join(chain) or "(no frames)")


async def _explain(nc: NatsClient, settings: Settings, what: str) -> None:
    try:
        async with asyncio.timeout(10):
            state = await describe_state(nc, settings)
    except Exception as err:
        state = f"(could not read the state: {err!r})"
    log.error("%s\n%s", what, state)


async def describe_state(nc: NatsClient, settings: Settings, *, max_items: int = 20) -> str:
    """What JetStream holds for one deployment, as text: the streams (with the subjects that hold messages), the
    tasks consumer, and the change-set records. For explaining a failed test; every part is best effort."""
    subjects = settings.subjects
    js = nc.jetstream(timeout=5)
    # (a reconnect explains a "no responders": the daemon's subscriptions were gone until it was done)
    lines: list[str] = [
        f"JetStream state of prefix {settings.prefix!r} (connection {connection_state(nc)}, "
        f"reconnected {nc.stats.get('reconnects', 0)} times):"
    ]
    # Every shard that may exist (rebaser_core.layout): the settings' streams, or shard 0 alone.
    shards = [subjects.for_shard(k) for k in range(settings.streams or 1)]
    for stream, filter_ in (
        *((s.requests_stream, s.requests_all) for s in shards),
        *((s.tasks_stream, s.tasks_all) for s in shards),
        (subjects.dead_letter_stream, subjects.dead_letters_all),
    ):
        try:
            info = await js.stream_info(stream, subjects_filter=filter_)
            held = sorted((info.state.subjects or {}).items())
            lines.append(
                f"  {stream}: {info.state.messages} messages, seq {info.state.first_seq}..{info.state.last_seq}"
                f", consumers {info.state.consumer_count}"
            )
            lines += [f"    {subject}: {count}" for subject, count in held[:max_items]]
            if len(held) > max_items:
                lines.append(f"    ... and {len(held) - max_items} more subjects")
        except Exception as err:
            lines.append(f"  {stream}: {err!r}")
    try:
        c = await js.consumer_info(subjects.tasks_stream, subjects.tasks_consumer)
        lines.append(
            f"  tasks consumer: pending {c.num_pending}, ack pending {c.num_ack_pending}, "
            f"redelivered {c.num_redelivered}, waiting pulls {c.num_waiting}"
        )
    except Exception as err:
        lines.append(f"  tasks consumer: {err!r}")
    try:
        kv = await js.key_value(subjects.change_sets_bucket)
        keys = await bucket_keys(js, subjects.change_sets_bucket)
        for key in sorted(keys)[:max_items]:
            entry = await kv.get(key)
            r = ChangeSetRecord.decode(entry.value or b"")
            lines.append(
                f"  record {key}: rev {entry.revision} epoch {r.epoch} owner {r.owner} applied_seq {r.applied_seq} "
                f"task {r.task_seq}/{r.task_delivery} handed_back {r.handed_back} dvu_pending {r.dvu_pending} "
                f"recent {len(r.recent)} attempts {dict(r.attempts)} suspect {r.suspect}"
            )
        if len(keys) > max_items:
            lines.append(f"  ... and {len(keys) - max_items} more records")
    except Exception as err:
        lines.append(f"  change-set records: {err!r}")
    return "\n".join(lines)
