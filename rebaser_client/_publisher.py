"""How the client puts a request into JetStream without ever buffering without bound.

- **In flight**: at most ``max_in_flight`` requests await their JetStream ack at once (a semaphore); waiting for a
  slot counts against ``publish_timeout``, and a caller that gets none in time is told ``RebaserBusy``.
- **Disconnected**: fail fast with ``RebaserUnavailable`` instead of queueing into nats-py's reconnect buffer
  (which would hold the bytes, and might send the request long after its caller was told it had not been).
- **Refused**: the stream's limits come back as ``RebaserBusy`` naming the limit (see ``rebaser_core.nats.tasks``).
- **Spool** (optional): a refused or undeliverable request goes to a bounded local SQLite spool instead of failing,
  and is replayed in order, with its original ``Nats-Msg-Id``, once NATS takes work again.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_client._spool import Spool, SpoolConfig
from rebaser_core.errors import (
    RebaserBusy,
    RebaserError,
    RebaserRefused,
    RebaserUnavailable,
)
from rebaser_core.nats.connect import connection_state
from rebaser_core.nats.requester import Requester, answered
from rebaser_core.nats.tasks import ensure_connected, parse_pub_ack, publish_task
from rebaser_core.subjects import Subjects

__all__ = ["ClientStatus", "Publisher", "Sent"]

log = logging.getLogger(__name__)

# Slots free up as acks come back (milliseconds each), so a caller refused for want of one may retry soon.
_IN_FLIGHT_RETRY_AFTER = 0.5
# An unanswered request publish is sent again after _RESEND_AFTER, then after twice the last pause each time, up to
# _RESEND_MAX, each pause jittered by up to _RESEND_JITTER either way (see resend_pauses and Publisher._acked).
_RESEND_AFTER = 2.0
_RESEND_MAX = 8.0
_RESEND_JITTER = 0.2
# A failed task publish is tried again after these pauses (doubling), for up to publish_timeout in all.
_TASK_RETRY_FIRST = 0.05
_TASK_RETRY_MAX = 0.5
# While disconnected the replayer looks at the connection this often (nats-py offers nothing to await).
_REPLAY_POLL = 0.1
# Publishes whose caller was cancelled, kept referenced until they finish (a bare task may be garbage-collected).
_UNFINISHED: set[asyncio.Future[bool]] = set()


def resend_pauses() -> Iterator[float]:
    """The pauses before each resend of a request publish left unanswered: :data:`_RESEND_AFTER`, then doubling up
    to :data:`_RESEND_MAX`, each jittered by up to :data:`_RESEND_JITTER` either way. A slow server is not sent a
    large request again every 2 s while it is still working through the first, and the requests of many callers left
    unanswered at once (a stalled server) are not all sent again at the same moment."""
    pause = _RESEND_AFTER
    while True:
        yield pause * random.uniform(1 - _RESEND_JITTER, 1 + _RESEND_JITTER)
        pause = min(pause * 2, _RESEND_MAX)


def _forget(publish: asyncio.Future[bool]) -> None:
    _UNFINISHED.discard(publish)
    if not publish.cancelled():
        publish.exception()  # retrieved: the caller saw it, or was cancelled and no longer cares


# Oldest spooled requests looked at per replay pass.
_REPLAY_BATCH = 256
# Cap on the pause after a refusal: a replay pass costs one refused publish per blocked change set, cheap enough
# to try a few times a second, so the spool drains soon after the stream does (the callers' retry_after is longer).
_REPLAY_MAX_PAUSE = 0.25


class Sent(enum.Enum):
    """What became of a request handed to :meth:`Publisher.send`."""

    PUBLISHED = "published"  # stored in the stream now
    DUPLICATE = "duplicate"  # the stream already held a request with this id (a resend): not stored again
    SPOOLED = "spooled"  # kept in the local spool, to be published later


@dataclass(frozen=True)
class ClientStatus:
    """The client's side of back-pressure (``RebaserClient.status()``)."""

    connection: str  # connected, reconnecting, connecting, draining, closed or disconnected
    in_flight: int  # requests awaiting their JetStream ack
    max_in_flight: int
    pending_bytes: int  # nats-py's outbound buffer (bounded by ConnectOptions.pending_size)
    spool_size: int | None  # spooled requests (None: no spool)
    spool_bytes: int | None
    spool_dropped: int  # spooled requests refused for good on replay (logged)
    last_publish_at: float | None  # wall-clock time of the last request JetStream acknowledged

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class Publisher:
    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        *,
        publish_timeout: float,
        max_in_flight: int,
        spool: SpoolConfig | None,
        reroute: Callable[[str, dict[str, str]], tuple[str, dict[str, str]]] | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self._nc = nc
        self._requester = Requester(nc)  # publish acks, twice per request: lighter than nc.request
        self._subjects = subjects
        # A spooled request is replayed to its change set's shard under the layout of the time of the replay.
        self._reroute = reroute
        self._publish_timeout = publish_timeout
        self._max_in_flight = max_in_flight
        self._slots = asyncio.Semaphore(max_in_flight)
        self._in_flight = 0
        # Cancelled callers' publishes, finished in the background (close() waits for them).
        self._finishing: set[asyncio.Future[bool]] = set()
        self._last_publish_at: float | None = None
        self._spool = Spool(spool) if spool is not None else None
        self._spool_dropped = 0
        self._replayer: asyncio.Task[None] | None = None
        self._start_lock = asyncio.Lock()
        # Told of each resend of an unanswered request publish: its subject, and the pause that went unanswered.
        self.on_resend: Callable[[str, float], None] | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open the spool (if any) and replay what it holds in the background. Idempotent."""
        if self._spool is None or self._replayer is not None:
            return
        async with self._start_lock:
            if self._replayer is None:
                await self._spool.open()
                self._replayer = asyncio.create_task(self._replay(self._spool), name="rebaser spool replay")

    async def close(self) -> None:
        """Give the spool ``flush_timeout`` to drain (while connected), then stop; the rest stays on disk. Cancelled
        callers' publishes get up to ``publish_timeout`` to finish first: their requests may be stored, and their
        tasks must go out while the connection is open (else they wait for the daemons' orphan sweep)."""
        if self._finishing and self._nc.is_connected:
            await asyncio.wait(set(self._finishing), timeout=self._publish_timeout)
        await self._close_spool()
        with contextlib.suppress(nats.errors.Error):
            await self._requester.close()  # its reply subscription (the connection may be the caller's)

    async def _close_spool(self) -> None:
        spool, replayer = self._spool, self._replayer
        if spool is None or replayer is None:
            return
        drained = not spool.size or (
            self._nc.is_connected and await spool.wait_empty(spool.config.flush_timeout)
        )
        if not drained:
            log.warning("closing with %d requests still spooled in %s", spool.size, spool.config.path)
        self._replayer = None
        replayer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await replayer
        await spool.close()

    def status(self) -> ClientStatus:
        spool = self._spool
        return ClientStatus(
            connection=connection_state(self._nc),
            in_flight=self._in_flight,
            max_in_flight=self._max_in_flight,
            pending_bytes=self._nc.pending_data_size,
            spool_size=None if spool is None else spool.size,
            spool_bytes=None if spool is None else spool.size_bytes,
            spool_dropped=self._spool_dropped,
            last_publish_at=self._last_publish_at,
        )

    # -- sending ----------------------------------------------------------------------------------------
    async def send(
        self,
        request_id: str,
        subject: str,
        headers: dict[str, str],
        body: bytes,
        task: str | None = None,
        *,
        hold: str | None = None,
    ) -> Sent:
        """Publish a request (and its task), or spool it (durable locally, sent later). With ``hold`` (why), it is
        not published now: spooled, or RebaserUnavailable(hold) without a spool."""
        await self.start()
        spool = self._spool
        if hold is not None:
            if spool is None:
                raise RebaserUnavailable(hold)
            await spool.add(request_id, subject, headers, body)
            log.info("request %s spooled: %s", request_id, hold)
            return Sent.SPOOLED
        if spool is not None and spool.holds(subject):
            # Earlier requests of this change set wait in the spool; publishing this one now would overtake them.
            await spool.add(request_id, subject, headers, body)
            return Sent.SPOOLED
        try:
            duplicate = await self._publish(request_id, subject, headers, body, task)
        except (RebaserBusy, RebaserUnavailable) as err:
            if spool is None:
                raise
            try:
                await spool.add(request_id, subject, headers, body)
            except RebaserBusy as full:
                raise RebaserBusy(f"{full}; NATS: {err}", full.retry_after, full.limit) from err
            log.info("request %s spooled: %s", request_id, err)
            return Sent.SPOOLED
        return Sent.DUPLICATE if duplicate else Sent.PUBLISHED

    async def _publish(
        self, request_id: str, subject: str, headers: dict[str, str], body: bytes, task: str | None = None
    ) -> bool:
        """Publish; True if the stream already held a request with this id (a duplicate, not stored again)."""
        what = f"publishing request {request_id}"
        ensure_connected(self._nc, what)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._publish_timeout
        try:
            if self._slots.locked():
                async with asyncio.timeout_at(deadline):
                    await self._slots.acquire()
            else:
                await self._slots.acquire()  # free: taken without waiting, so no timer is armed for it
        except TimeoutError:
            raise RebaserBusy(
                f"{what}: {self._max_in_flight} requests already await JetStream (max_in_flight) "
                f"after {self._publish_timeout:g}s",
                retry_after=_IN_FLIGHT_RETRY_AFTER,
                limit="in_flight",
            ) from None
        self._in_flight += 1
        return await self._publish_in_slot(what, request_id, subject, headers, body, task, deadline)

    async def _publish_in_slot(
        self,
        what: str,
        request_id: str,
        subject: str,
        headers: dict[str, str],
        body: bytes,
        task: str | None,
        deadline: float,
    ) -> bool:
        """Publish the request and its task, holding a slot taken by the caller (released here, or by the
        background task that finishes for a cancelled caller)."""
        loop = asyncio.get_running_loop()
        ack: asyncio.Future[Msg] | None = None
        try:
            if task is None:  # a replayed request: only its subject was spooled
                task = self._task_of(subject)
            ensure_connected(self._nc, what)  # it may have dropped while we waited for a slot
            try:
                await self._requester.ready()
                reply_to, ack = self._requester.expect(max(deadline - loop.time(), 0.001))
                await self._nc.publish(subject, body, reply=reply_to, headers=headers)
                reply = answered(await self._acked(ack, subject, body, reply_to, headers))
            except nats.errors.NoRespondersError:
                raise RebaserUnavailable(
                    f"no JetStream stream answers on {subject}: is a daemon set up?"
                ) from None
            except nats.errors.MaxPayloadError:
                raise RebaserRefused(f"{what}: larger than the server's max_payload") from None
            except (TimeoutError, nats.errors.Error) as err:
                # A timeout, or the connection dropped mid-request (ConnectionClosedError, OutboundBufferLimitError).
                raise RebaserUnavailable(f"{what} failed: {err or type(err).__name__}") from None
            pub_ack = parse_pub_ack(reply.data, subject)
            duplicate = bool(pub_ack.get("duplicate", False))
            self._last_publish_at = time.time()
            # The request is durable now. A failed task publish strands nothing: the daemons' orphan sweep finds it.
            await self._publish_task(request_id, task)
        except asyncio.CancelledError:
            # The caller was cancelled (its timeout, say). Once nats-py has the request it sends it, so it may be
            # stored, and a stored request without its task is stranded until the orphan sweep. So the rest is
            # finished in the background: the wait for the request's ack (its task must not reach a daemon before
            # the request is stored: the daemon would find nothing queued and let go), then the task, then the
            # slot is freed. Only then: a shielded task per request would cost about 8 % of the client's CPU.
            if ack is None or task is None:  # cancelled before nats-py had the request: nothing was sent
                self._release()
                raise
            finish = asyncio.ensure_future(self._finish_cancelled(request_id, task, ack))
            _UNFINISHED.add(finish)
            self._finishing.add(finish)
            finish.add_done_callback(_forget)
            finish.add_done_callback(self._finishing.discard)
            finish.add_done_callback(self._release)  # also if it is cancelled before it first runs
            raise
        except BaseException:
            if ack is not None:
                ack.cancel()  # no longer awaited (a no-op once answered)
            self._release()
            raise
        self._release()
        return duplicate

    async def _acked(
        self, ack: asyncio.Future[Msg], subject: str, body: bytes, reply_to: str, headers: dict[str, str]
    ) -> Msg:
        """The request's acknowledgement (the requester fails ``ack`` at the caller's deadline). Not cancelled with a
        cancelled caller (see below). Sent again, to the same reply subject, while it goes unanswered: first after
        :data:`_RESEND_AFTER`, then ever less often (:func:`resend_pauses`). A publish written to a connection that
        then drops is lost without a word (found after a server restart: a request published right after the
        reconnect waited out its caller's 10 s); but an answer may also be late because the server is busy, and a
        large request sent again every 2 s adds to its load. Its ``Nats-Msg-Id`` makes the stream store it once; a
        late first answer settles ``ack`` all the same."""
        for pause in resend_pauses():
            done, _ = await asyncio.wait({ack}, timeout=pause)
            if done:
                break
            if self._nc.is_connected:
                await self._nc.publish(subject, body, reply=reply_to, headers=headers)
                if self.on_resend is not None:
                    self.on_resend(subject, pause)
        return ack.result()

    def _release(self, _: object = None) -> None:
        self._in_flight -= 1
        self._slots.release()

    def _task_of(self, subject: str) -> str:
        names = self._subjects.for_shard(self._subjects.shard_of_subject(subject))
        parsed = names.parse_requests(subject)
        return names.task(parsed.workspace_id, parsed.change_set_id)

    async def _finish_cancelled(self, request_id: str, task: str, ack: asyncio.Future[Msg]) -> bool:
        """What a cancelled caller's publish leaves to do: wait for the request's ack, then publish its task."""
        with contextlib.suppress(TimeoutError, nats.errors.Error):
            await ack  # stored, refused or not known: the task harms nothing (the daemon drops an empty one)
        await self._publish_task(request_id, task)
        return False

    async def _publish_task(self, request_id: str, task: str) -> None:
        """Publish the task of a stored request, retried for ``publish_timeout``: a stream leader election (no
        responders, or no answer, for a second or two) or a reconnect to another node must not leave the request
        to the orphan sweep, which may come only after ``sweep_interval``. The task is idempotent (one per change
        set), so a retry after an ambiguous failure is harmless."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._publish_timeout
        pause = _TASK_RETRY_FIRST
        while True:
            try:
                await publish_task(
                    self._nc, task, timeout=max(deadline - loop.time(), 0.001), requester=self._requester
                )
                return
            except RebaserError as err:
                if loop.time() + pause >= deadline or self._nc.is_closed:
                    log.warning(
                        "task publish for request %s failed (the orphan sweep finds it): %s", request_id, err
                    )
                    return
            await asyncio.sleep(pause)
            pause = min(pause * 2, _TASK_RETRY_MAX)

    # -- replaying the spool ------------------------------------------------------------------------------
    async def _replay(self, spool: Spool) -> None:
        while True:
            if spool.size == 0:
                spool.added.clear()
                if spool.size == 0:
                    await spool.added.wait()
                continue
            if not self._nc.is_connected:
                await asyncio.sleep(_REPLAY_POLL)
                continue
            try:
                pause = await self._replay_pass(spool)
            except Exception:
                log.exception("spool replay failed; trying again")
                pause = _REPLAY_MAX_PAUSE
            if pause > 0:
                await asyncio.sleep(pause)

    async def _replay_pass(self, spool: Spool) -> float:
        """Publish what NATS takes now, oldest first; return how long to pause before the next pass."""
        head = await spool.head(_REPLAY_BATCH)
        if not head:
            return _REPLAY_POLL  # counted but not yet committed by its writer
        blocked: set[str] = set()  # change sets refused in this pass: their later requests must wait too
        pause = 0.0
        for entry in head:
            if entry.subject in blocked:
                continue
            try:
                subject, headers = entry.subject, entry.headers
                if self._reroute is not None:
                    subject, headers = self._reroute(subject, dict(headers))
                await self._publish(entry.request_id, subject, headers, entry.body)
            except RebaserBusy as err:
                if err.limit != "change_set":
                    return min(err.retry_after, _REPLAY_MAX_PAUSE)  # the stream or the client is full
                blocked.add(entry.subject)
                pause = max(pause, min(err.retry_after, _REPLAY_MAX_PAUSE))
                continue
            except RebaserUnavailable:
                return _REPLAY_POLL
            except RebaserRefused as err:
                # Refused for good (e.g. over the size limit): kept, it would block its change set forever.
                self._spool_dropped += 1
                log.error("dropping spooled request %s: %s", entry.request_id, err)
            await spool.remove(entry)
        return pause
