"""What the events stream holds, read raw (no follower's dedupe or gap check), and the feed's promises checked on it."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rebaser_client import EventStream
from rebaser_core.api import CHANGE_SET_EVENT, ChangeSetEvent
from rebaser_core.errors import ProtocolError
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for


async def stored_events(
    js: JetStreamContext, settings: Settings, wk: WorkspacePk, cs: ChangeSetId, *, deadline: float = 60.0
) -> list[ChangeSetEvent]:
    """Every event the stream holds for one change set, in stream order, repeats included."""
    return [event for _, event in await stored_feed(js, settings, wk, cs, deadline=deadline)]


async def stored_feed(
    js: JetStreamContext, settings: Settings, wk: WorkspacePk, cs: ChangeSetId, *, deadline: float = 60.0
) -> list[tuple[int, ChangeSetEvent]]:
    """Every event the stream holds for one change set with its stream sequence, in stream order, repeats included.

    Read message by message (the next on the subject after the last one read: no consumer, so nothing a consumer's
    reset could repeat or skip). The read is tried again until ``deadline`` seconds have passed: right after node
    kills the events stream may still be electing its leader, and a checker that gives up then says nothing about
    the feed."""

    async def read() -> tuple[list[tuple[int, ChangeSetEvent]]]:
        return (await _read_events(js, settings, wk, cs),)  # a tuple: no events read is an answer too

    (events,) = await wait_for(
        read,
        timeout=deadline,
        interval=0.5,
        retry_on=(TimeoutError, nats.errors.Error),
        message=f"the events of {wk}/{cs} could not be read",
    )
    return events


async def _read_events(
    js: JetStreamContext, settings: Settings, wk: WorkspacePk, cs: ChangeSetId
) -> list[tuple[int, ChangeSetEvent]]:
    subjects = settings.subjects
    subject = subjects.events(wk, cs)
    events: list[tuple[int, ChangeSetEvent]] = []
    seq = 0
    while True:
        try:
            msg = await js.get_msg(subjects.events_stream, seq=seq + 1, subject=subject, next=True)
        except NotFoundError:
            return events
        assert msg.seq is not None and msg.seq > seq, (msg.seq, seq)
        seq = msg.seq
        with contextlib.suppress(ProtocolError):  # not an event: the feed's promises are about events
            events.append((seq, CHANGE_SET_EVENT.decode(msg.headers, msg.data or b"")))


def describe_feed(feed: Sequence[tuple[int, ChangeSetEvent]]) -> str:
    """A change set's stored events one per line (stream sequence, kind, seq, epoch, owner, id): what a failed
    check of the feed prints, to tell which ownership stored what."""
    return "\n".join(
        f"  #{stream_seq} {event.kind} seq {event.seq} epoch {event.epoch}"
        f"{' durable' if event.durable else ''} owner {event.owner or '-'} id {event.id}"
        for stream_seq, event in feed
    )


def check_feed(events: Sequence[ChangeSetEvent], applied: Sequence[str]) -> list[str]:
    """What is wrong with a change set's stored events (in stream order), given the request ids its record says
    were applied in order: the durable events are stored in ``seq`` order, each once (no fenced owner's event
    shows, and nothing is stored again), the seqs kept have no hole, and the applied requests' events name exactly
    the tail of ``applied`` the stream still keeps, once each, in order."""
    problems: list[str] = []
    by_seq: dict[int, ChangeSetEvent] = {}
    last: ChangeSetEvent | None = None
    for event in events:
        if not event.durable:
            continue
        if last is not None and event.seq <= last.seq:
            again = " again" if event.seq in by_seq and by_seq[event.seq].id == event.id else ""
            problems.append(
                f"seq {event.seq} (epoch {event.epoch}) is stored{again} after seq {last.seq} (epoch {last.epoch})"
            )
        if last is None or event.seq > last.seq:
            last = event
        seen = by_seq.setdefault(event.seq, event)
        if seen.id != event.id:
            problems.append(
                f"seq {event.seq} holds two events: {seen.kind} {seen.id} and {event.kind} {event.id}"
            )
    seqs = sorted(by_seq)
    if seqs and seqs != list(range(seqs[0], seqs[-1] + 1)):
        problems.append(f"durable seqs have holes: {seqs[0]}..{seqs[-1]}, {len(seqs)} kept")
    requests = [str(by_seq[s].request_id) for s in seqs if by_seq[s].request_id is not None]
    if requests and (len(requests) > len(applied) or list(applied[-len(requests) :]) != requests):
        problems.append(f"events name {len(requests)} requests that are not the tail of the applied ones")
    if seqs and seqs[0] == 1 and len(requests) != len(applied):
        problems.append(f"all events kept, yet {len(requests)} name requests and {len(applied)} were applied")
    return problems


async def next_durable(stream: EventStream, count: int, timeout: float = 20) -> list[ChangeSetEvent]:
    """The next ``count`` durable events of ``stream`` (notices skipped)."""
    found: list[ChangeSetEvent] = []
    while len(found) < count:
        event = await stream.next(timeout)
        if event.durable:
            found.append(event)
    return found


def check_record_feed(
    seen: Sequence[ChangeSetEvent], window: Sequence[ChangeSetEvent], stored: Sequence[ChangeSetEvent]
) -> list[str]:
    """What is wrong with one change set's record feed, against its events stream (checked by :func:`check_feed`:
    both feeds are made of the same events): every event a follower of the record feed yielded (``seen``) is the
    stored event of its seq, in increasing seq (none given twice, none of a fenced owner or of a rolled-back write),
    and the window the record's last write carries is the last events stored, without a hole."""
    problems: list[str] = []
    by_seq = {event.seq: event for event in stored if event.durable}
    for before, after in itertools.pairwise(seen):
        if after.seq <= before.seq:
            problems.append(f"the follower got seq {after.seq} after seq {before.seq}")
    for event in seen:
        kept = by_seq.get(event.seq)
        if kept is not None and kept.id != event.id:
            problems.append(
                f"the follower got {event.kind} {event.id} as seq {event.seq}; stored: {kept.kind} {kept.id}"
            )
    if window:
        last = max(by_seq, default=0)
        if window[-1].seq != last:
            problems.append(f"the record's window ends at seq {window[-1].seq}, the stream at {last}")
        for event in window:
            kept = by_seq.get(event.seq)
            if kept is not None and kept.id != event.id:
                problems.append(f"the record's window holds {event.kind} {event.id} as seq {event.seq}")
    return problems


async def record_window(
    js: JetStreamContext, settings: Settings, wk: WorkspacePk, cs: ChangeSetId
) -> list[ChangeSetEvent]:
    """The events the change set record's last write carries (its window)."""
    from rebaser_client._record_feed import window_of_write

    subjects = settings.subjects
    try:
        raw = await js.get_last_msg(subjects.records_stream, subjects.record_subject(wk, cs))
    except NotFoundError:
        return []
    window = window_of_write(raw.headers, wk, cs)
    return [] if window is None else list(window.events)
