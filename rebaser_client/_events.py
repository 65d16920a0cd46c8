"""Following a change set's (or a workspace's) events: :class:`EventStream`, what ``RebaserClient.watch`` returns.

Events come from the writes of the change sets' records (``feed="records"``, the default): each write carries the
change set's last durable events in its ``Rebaser-Events`` header (rebaser_core.api.event_window), read through an
ordered consumer of the change-sets bucket's stream that delivers headers only. The KV keeps one revision per key,
so a follower that falls behind skips revisions, and the next one it gets still holds the last ``events_window``
events. With ``feed="stream"`` they come from the ``REBASER_EVENTS`` stream instead, which daemons publish only
with ``events`` on (notices too; the feed of earlier releases).

Either way the consumer is an ordered one (nats-py recreates it by itself after a lost message or a reconnect, from
where it was), created through the daemons (``rebaser.api.follow.<wk>``, rebaser_server.queries.follow), so a
follower needs no JetStream API of its own. Durable events are numbered per change set without holes
(rebaser_core.api.events), so this side drops a repeat and notices a gap: a durable event whose ``seq`` jumps
raises :class:`EventsLost`, which says how many were lost and where to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import deque
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal, Self

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import api as js_api

from rebaser_core.api import (
    CHANGE_SET_EVENT,
    EVENTS_HEADER,
    MAX_EVENT_BYTES,
    ChangeSetEvent,
    EventWindow,
    read_window,
)
from rebaser_core.errors import EventsLost, InvalidSubject, ProtocolError, RebaserUnavailable
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.subjects import Subjects

__all__ = ["EventStream", "Feed"]

Feed = Literal["records", "stream"]
_HEARTBEAT = 2.0  # seconds between the consumer's idle heartbeats

log = logging.getLogger(__name__)


def _consumer_name() -> str:
    """A new name for the follower's consumer. A named consumer is created on the API subject that carries its filter
    (``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``), which NATS permissions can confine to one workspace
    (docs/nats-accounts.conf); an unnamed one is created on ``...CREATE.<stream>``, which allows any filter."""
    return f"rebaser_watch_{secrets.token_hex(8)}"


def _rename_on_recreate(sub: Any) -> None:
    """Give each consumer nats-py's ordered consumer recreates (after a lost delivery or missed heartbeats) a new
    name, as the server gives unnamed ones: the old consumer may still exist until the server reaps it, and
    recreating under its name then fails (its delivery policy cannot change), stalling the feed until then.

    nats-py has no option for it: this wraps its (private) recreation hook; without the hook, a recreation keeps the
    name and only stalls for those seconds."""
    jsi: Any = getattr(getattr(sub, "_sub", None), "_jsi", None)
    recreate = getattr(jsi, "recreate_consumer", None)
    config = getattr(jsi, "_ccreq", None)
    if recreate is None or not isinstance(config, js_api.ConsumerConfig):
        log.debug("nats-py's ordered consumer has no recreation hook: its consumer keeps its name")
        return

    async def recreate_renamed() -> None:
        config.name = _consumer_name()
        await recreate()

    jsi.recreate_consumer = recreate_renamed


class EventStream:
    """``async for event in stream`` yields :class:`~rebaser_core.api.ChangeSetEvent` in order, each durable event
    once. ``since``: resume after that durable ``seq`` (one change set), or after each change set's seq in a mapping
    (a workspace); ``None``: only what happens from now on. ``feed``: where the events are read (the module's
    docstring). ``malformed`` counts messages that were not events (skipped)."""

    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        workspace_id: WorkspacePk,
        change_set_id: ChangeSetId | None,
        since: int | Mapping[ChangeSetId, int] | None,
        feed: Feed = "records",
    ) -> None:
        self._nc = nc
        self._workspace_id = workspace_id
        self._change_set_id = change_set_id
        self._subjects = subjects
        self._records = feed == "records"
        if self._records:
            self._stream = subjects.records_stream
            self._filter = (
                subjects.records_of_workspace(workspace_id)
                if change_set_id is None
                else subjects.record_subject(workspace_id, change_set_id)
            )
        elif feed == "stream":
            self._stream = subjects.events_stream
            self._filter = (
                subjects.events_of_workspace(workspace_id)
                if change_set_id is None
                else subjects.events(workspace_id, change_set_id)
            )
        else:
            raise ValueError(f"feed must be 'records' or 'stream', not {feed!r}")
        # change set -> the last durable seq seen (or resumed after): a durable event must come right after it.
        self._last: dict[ChangeSetId, int] = {}
        if isinstance(since, int):
            if change_set_id is None:
                raise ValueError("since as a number needs a change set; give a mapping for a workspace")
            self._last[change_set_id] = since
        elif since is not None:
            self._last.update(since)
        self._replay = since is not None
        self._sub: Any = None
        # Events to yield before reading more: a window's new ones, or those after a gap (after EventsLost).
        self._ready: deque[ChangeSetEvent] = deque()
        self.malformed = 0

    async def start(self) -> Self:
        # The daemons create the consumer on this follower's behalf: the JetStream API under the workspace's prefix.
        js = self._nc.jetstream(prefix=self._subjects.follow_api(self._workspace_id))
        if not self._replay:
            policy = js_api.DeliverPolicy.NEW
        elif self._records:  # each change set's last write holds its last events
            policy = js_api.DeliverPolicy.LAST_PER_SUBJECT
        else:
            policy = js_api.DeliverPolicy.ALL
        try:
            self._sub = await js.subscribe(
                self._filter,
                stream=self._stream,
                ordered_consumer=True,
                deliver_policy=policy,
                headers_only=self._records or None,
                # Missing two heartbeats (4 to 8 s) makes nats-py make the consumer again, from where it was: its
                # default of 5 s takes 10 to 20 s, in which a busy change set decides more than a window of events
                # (a server failing under the consumer). A heartbeat is a few bytes every 2 s per idle follower.
                idle_heartbeat=_HEARTBEAT,
                config=js_api.ConsumerConfig(name=_consumer_name(), headers_only=self._records or None),
            )
        except nats.js.errors.NotFoundError as err:
            if self._records:
                raise RebaserUnavailable(
                    f"cannot follow {self._filter}: the deployment has no {self._stream} stream (has a daemon "
                    "started here?)"
                ) from err
            # No events stream: the daemons of this deployment do not publish the feed.
            raise RebaserUnavailable(
                f"cannot follow {self._filter}: the deployment has no {self._stream} stream; its daemons publish "
                "events only with the feed on (REBASER_EVENTS=true, or events = true in their --config file)"
            ) from err
        except (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError) as err:
            said = getattr(err, "description", None)
            if said:  # a daemon answered: it could not make the consumer
                raise RebaserUnavailable(f"cannot follow {self._filter}: {said}") from err
            if self._records:
                raise RebaserUnavailable(
                    f"cannot follow {self._filter}: no daemon answers (the daemons make a follower's consumer): "
                    "has a daemon started here?"
                ) from err
            raise RebaserUnavailable(
                f"cannot follow {self._filter}: no daemon answers. The daemons make a follower's consumer, and "
                "publish events only with the feed on (REBASER_EVENTS=true, or events = true in their --config file)"
            ) from err
        except (nats.errors.Error, TimeoutError) as err:
            raise RebaserUnavailable(f"cannot follow {self._filter}: {err!r}") from err
        _rename_on_recreate(self._sub)
        return self

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            # The connection may be closed or draining: nothing to unsubscribe from then.
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def __aenter__(self) -> Self:
        if self._sub is None:
            await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ChangeSetEvent:
        if self._sub is None:
            await self.start()
        while True:
            if self._ready:
                return self._ready.popleft()
            try:
                msg = await self._sub.next_msg(timeout=None)
            except nats.errors.ConnectionClosedError:
                raise StopAsyncIteration from None
            event = self._take(msg)
            if event is not None:
                return event

    async def next(self, timeout: float) -> ChangeSetEvent:
        """The next event, or ``TimeoutError`` after ``timeout`` seconds without one."""
        if self._sub is None:
            await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._ready:
                return self._ready.popleft()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no event on {self._filter} within {timeout:g} s")
            try:
                msg = await self._sub.next_msg(timeout=remaining)
            except nats.errors.TimeoutError:
                raise TimeoutError(f"no event on {self._filter} within {timeout:g} s") from None
            event = self._take(msg)
            if event is not None:
                return event

    def _take(self, msg: Msg) -> ChangeSetEvent | None:
        """The event ``msg`` gives to yield now (more may wait in ``_ready``), or None; EventsLost on a gap."""
        if self._records:
            window = self._window_of(msg)
            if window is not None:
                self._admit_window(*window)
            return self._ready.popleft() if self._ready else None
        event = self._decode(msg)
        return event if event is not None and self._admit(event) else None

    def _window_of(self, msg: Msg) -> tuple[ChangeSetId, EventWindow] | None:
        """The window a record write carries, if it is one of this stream's change sets' and reads."""
        try:
            on = self._subjects.parse_record_subject(msg.subject)
        except InvalidSubject as err:
            self._skip(msg, str(err))
            return None
        if on.workspace_id != self._workspace_id or self._change_set_id not in (None, on.change_set_id):
            self._skip(msg, "it is not a change set this stream follows")
            return None
        value = (msg.headers or {}).get(EVENTS_HEADER)
        if value is None:
            return None  # a write with no events yet (a fork's first record), or by a daemon without the feed
        try:
            window = read_window(value, on.workspace_id, on.change_set_id)
        except ProtocolError as err:
            self._skip(msg, str(err))
            return None
        return on.change_set_id, window

    def _admit_window(self, cs: ChangeSetId, window: EventWindow) -> None:
        """Queue what of ``window`` is new to this stream, in order; EventsLost if events between are gone."""
        last = self._last.get(cs)
        fresh = window.fresh(last, replay=self._replay)
        self._last[cs] = max(last or 0, window.last_seq)
        if not fresh:
            return
        self._ready.extend(fresh)
        if last is not None and fresh[0].seq > last + 1:
            raise EventsLost(self._workspace_id, cs, expected=last + 1, got=fresh[0].seq)

    def _decode(self, msg: Msg) -> ChangeSetEvent | None:
        if len(msg.data) > MAX_EVENT_BYTES:
            self._skip(msg, f"{len(msg.data)} bytes, over {MAX_EVENT_BYTES}")
            return None
        try:
            event = CHANGE_SET_EVENT.decode(msg.headers, msg.data)
        except ProtocolError as err:
            self._skip(msg, str(err))
            return None
        try:
            on = self._subjects.parse_events(msg.subject)
        except InvalidSubject as err:
            self._skip(msg, str(err))
            return None
        if (on.workspace_id, on.change_set_id) != (event.workspace_id, event.change_set_id):
            self._skip(msg, "its ids are not those of its subject")
            return None
        # Only what this stream follows: anything else reached its inbox by someone else's doing.
        if on.workspace_id != self._workspace_id or self._change_set_id not in (None, on.change_set_id):
            self._skip(msg, "it is not an event this stream follows")
            return None
        return event

    def _skip(self, msg: Msg, why: str) -> None:
        self.malformed += 1
        log.warning("skipped a message on %s that is not a change-set event: %s", msg.subject, why[:200])

    def _admit(self, event: ChangeSetEvent) -> bool:
        """Whether to yield ``event``: a durable one once, in order (else EventsLost); a notice unless older than
        where this stream resumed."""
        cs = event.change_set_id
        last = self._last.get(cs)
        if not event.durable:
            return last is None or event.seq >= last
        if last is None or event.seq == last + 1:
            self._last[cs] = event.seq
            return True
        if event.seq <= last:
            return False  # a republished one, already seen
        self._last[cs] = event.seq
        self._ready.append(event)
        raise EventsLost(self._workspace_id, cs, expected=last + 1, got=event.seq)

    def resume_points(self) -> dict[ChangeSetId, int]:
        """Each change set's last durable seq seen: ``since`` for a new stream that goes on from here."""
        return dict(self._last)
