"""Following a change set's (or a workspace's) events: :class:`EventStream`, what ``RebaserClient.watch`` returns.

Events come from the ``REBASER_EVENTS`` stream through an ordered consumer (nats-py recreates it by itself after
a lost message or a reconnect, from where it was). The consumer is created through the daemons
(``rebaser.api.follow.<wk>``, rebaser_server.queries.follow), so a follower needs no JetStream API of its own.
Durable events are numbered per change set without holes (rebaser_core.api.events), so this side drops a repeat
(a republish after a crash) and notices a gap: a durable event whose ``seq`` jumps raises :class:`EventsLost`,
which says how many were lost and where to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import api as js_api

from rebaser_core.api import CHANGE_SET_EVENT, MAX_EVENT_BYTES, ChangeSetEvent
from rebaser_core.errors import EventsLost, InvalidSubject, ProtocolError, RebaserUnavailable
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.subjects import Subjects

__all__ = ["EventStream"]

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
    (a workspace); ``None``: only what happens from now on. ``malformed`` counts messages on the events subjects
    that were not events (skipped)."""

    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        workspace_id: WorkspacePk,
        change_set_id: ChangeSetId | None,
        since: int | Mapping[ChangeSetId, int] | None,
    ) -> None:
        self._nc = nc
        self._workspace_id = workspace_id
        self._change_set_id = change_set_id
        self._subjects = subjects
        if change_set_id is None:
            self._filter = subjects.events_of_workspace(workspace_id)
        else:
            self._filter = subjects.events(workspace_id, change_set_id)
        self._stream = subjects.events_stream
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
        self._after_gap: ChangeSetEvent | None = (
            None  # the event that revealed a gap: yielded after EventsLost
        )
        self.malformed = 0

    async def start(self) -> Self:
        # The daemons create the consumer on this follower's behalf: the JetStream API under the workspace's prefix.
        js = self._nc.jetstream(prefix=self._subjects.follow_api(self._workspace_id))
        policy = js_api.DeliverPolicy.ALL if self._replay else js_api.DeliverPolicy.NEW
        try:
            self._sub = await js.subscribe(
                self._filter,
                stream=self._stream,
                ordered_consumer=True,
                deliver_policy=policy,
                config=js_api.ConsumerConfig(name=_consumer_name()),
            )
        except nats.js.errors.NotFoundError as err:
            # No events stream: the daemons of this deployment do not publish the feed.
            raise RebaserUnavailable(
                f"cannot follow {self._filter}: the deployment has no {self._stream} stream; its daemons publish "
                "events only with the feed on (REBASER_EVENTS=true, or events = true in their --config file)"
            ) from err
        except (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError) as err:
            said = getattr(err, "description", None)
            if said:  # a daemon answered: it could not make the consumer
                raise RebaserUnavailable(f"cannot follow {self._filter}: {said}") from err
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
            gap = self._after_gap
            if gap is not None:
                self._after_gap = None
                return gap
            try:
                msg = await self._sub.next_msg(timeout=None)
            except nats.errors.ConnectionClosedError:
                raise StopAsyncIteration from None
            event = self._decode(msg)
            if event is not None and self._admit(event):
                return event

    async def next(self, timeout: float) -> ChangeSetEvent:
        """The next event, or ``TimeoutError`` after ``timeout`` seconds without one."""
        if self._sub is None:
            await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            gap = self._after_gap
            if gap is not None:
                self._after_gap = None
                return gap
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no event on {self._filter} within {timeout:g} s")
            try:
                msg = await self._sub.next_msg(timeout=remaining)
            except nats.errors.TimeoutError:
                raise TimeoutError(f"no event on {self._filter} within {timeout:g} s") from None
            event = self._decode(msg)
            if event is not None and self._admit(event):
                return event

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
        self._last[cs], self._after_gap = event.seq, event
        raise EventsLost(self._workspace_id, cs, expected=last + 1, got=event.seq)

    def resume_points(self) -> dict[ChangeSetId, int]:
        """Each change set's last durable seq seen: ``since`` for a new stream that goes on from here."""
        return dict(self._last)
