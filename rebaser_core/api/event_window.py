"""A change set's last durable events, carried by every write of its record: the ``Rebaser-Events`` header.

The owning daemon numbers a change set's durable events (rebaser_core.api.events) when it commits them, and the
commit is one write of the change set's record to the change-sets KV bucket. That write carries, in this header, the
change set's last events (at most ``events_window``, oldest first, ``seq`` without holes), so the feed costs no
message of its own: an event exists exactly when its commit is stored, never twice, and an owner fenced at its commit
shows none. Every later write of the record (a takeover, a hand-back) carries the same window on.

A follower reads the headers only (a headers-only consumer of the bucket's stream, docs/protocol.md §17). The KV keeps
one revision per key, so a follower that falls behind misses revisions; the next one it gets holds the last events
all the same, and only a follower more than a window behind loses events (it sees ``seq`` jump).

The value is JSON: ``{"v": 2, "new": N, "events": [event, ...]}``, each event a ChangeSetEvent v1 in a short form,
for every write carries the whole window (a window's bytes cost the servers about 2-4 µs a KiB on every write):

- without the fields every event of the window shares: ``workspace_id`` and ``change_set_id`` (the subject's) and
  ``durable`` (true);
- its other fields under the one- or two-letter names of :data:`SHORT_NAMES` (``id`` keeps its own);
- without what it tells otherwise: ``at``, the millisecond its ``id`` (a ULID) begins with; ``kind`` when it is
  ``applied``; the ``status`` of an ``applied``, ``conflicts``, ``refused`` or ``error_reply`` event, which its kind
  names (:data:`STATUS_OF_KIND`); and ``queued`` when it is 0.

:func:`read_window` puts it all back. ``new`` says how many of the last events this write decided (0 for a write
that decided none). JSON keeps the value to printable ASCII, as a header value must be.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from rebaser_core.api.events import MAX_EVENT_BYTES, ChangeSetEvent, EventKind
from rebaser_core.errors import DecodeError
from rebaser_core.ids import ChangeSetId, WorkspacePk, ulid_milliseconds

__all__ = [
    "EVENTS_HEADER",
    "MAX_WINDOW",
    "MAX_WINDOW_BYTES",
    "SHORT_NAMES",
    "STATUS_OF_KIND",
    "EventWindow",
    "event_text",
    "read_window",
    "split_window",
    "window_header",
]

EVENTS_HEADER = "Rebaser-Events"
# The most events a window holds (``events_window`` is at most this), and so the longest value read: anything longer
# is refused before it is parsed.
MAX_WINDOW = 64
MAX_WINDOW_BYTES = MAX_WINDOW * (MAX_EVENT_BYTES + 1) + 64
_VERSION = 2
_HEAD = re.compile(r'\{"v":2,"new":\d{1,2},"events":\[')
_DECODER = json.JSONDecoder()
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
# Fields every event of a window has alike, left out of it (the follower puts them back).
_SHARED = frozenset({"workspace_id", "change_set_id", "durable"})
# A request outcome's status, which an event of the window may leave out: its kind says it (not so a dead letter's).
STATUS_OF_KIND: dict[EventKind, str] = {
    "applied": "success",
    "conflicts": "conflicts",
    "refused": "refused",
    "error_reply": "error",
}
# A field's name in a window's events (``id`` and any field not named here keep their own).
SHORT_NAMES: dict[str, str] = {
    "kind": "k",
    "at": "t",
    "epoch": "e",
    "seq": "n",
    "request_id": "r",
    "status": "s",
    "queued": "q",
    "updates_performed": "u",
    "snapshot_address": "a",
    "conflicts": "c",
    "reason": "y",
    "duration_s": "d",
    "settled": "z",
    "owner": "o",
    "error": "x",
}
_STATUS: dict[str, str] = {str(kind): status for kind, status in STATUS_OF_KIND.items()}  # by any text
_LONG_NAMES = {short: name for name, short in SHORT_NAMES.items()}
_LONG = frozenset(SHORT_NAMES)
# What an event of a window leaves out when it is so ("kind" applied; "queued" 0 for a request's outcome).
_DEFAULT_KIND = "applied"
_OUTCOMES = frozenset({*STATUS_OF_KIND, "dead_lettered"})
_ULID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
# What a header value starts with, for each count of new events (one per commit: made once).
_HEADS = tuple(f'{{"v":{_VERSION},"new":{new},"events":[' for new in range(MAX_WINDOW + 1))


@dataclass(frozen=True, slots=True)
class EventWindow:
    """A record write's events: ``events`` oldest first, the last ``new`` of them decided by that write."""

    new: int
    events: tuple[ChangeSetEvent, ...]

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq if self.events else 0

    def fresh(self, last: int | None, *, replay: bool) -> list[ChangeSetEvent]:
        """The events new to a reader whose last event of this change set is ``last``: those after it; for a change
        set it has not seen yet (None), all of them when replaying, else only those this write decided."""
        if last is not None:
            return [event for event in self.events if event.seq > last]
        return list(self.events if replay else self.events[len(self.events) - self.new :])


def event_text(event: Mapping[str, object]) -> str:
    """An event (its JSON-model form) as it goes into a window: compact JSON, ASCII only, in the window's short form
    (the module's docstring). ``rebaser_server.changeset.event_texts`` writes the same text straight."""
    kind = str(event.get("kind"))
    short: dict[str, object] = {}
    for name, value in event.items():
        if (
            name in _SHARED
            or (name == "kind" and value == _DEFAULT_KIND)
            or (name == "status" and _STATUS.get(kind) == value)
            or (name == "queued" and value == 0 and kind in _OUTCOMES)
            or (name == "settled" and value is False)
        ):
            continue
        short[SHORT_NAMES.get(name, name)] = value
    return _ENCODE(short)


def window_header(events: Sequence[str], new: int) -> str:
    """The header value of a write whose window is ``events`` (as :func:`event_text` made them), the last ``new``
    of them decided by it. Joined, not encoded again: the events before were encoded by earlier writes."""
    return "".join((_HEADS[new], ",".join(events), "]}"))


def _parsed(value: str) -> tuple[int, list[object]]:
    if len(value) > MAX_WINDOW_BYTES:
        raise DecodeError(f"an event window of {len(value)} bytes is longer than {MAX_WINDOW_BYTES}")
    try:
        raw = json.loads(value)
    except (ValueError, RecursionError):
        raise DecodeError("the event window is not JSON") from None
    if not isinstance(raw, dict) or raw.get("v") != _VERSION:
        raise DecodeError(f"the event window is not a version {_VERSION} object")
    new, events = raw.get("new"), raw.get("events")
    if not isinstance(new, int) or isinstance(new, bool) or not isinstance(events, list):
        raise DecodeError("the event window needs a whole 'new' and a list of 'events'")
    if len(events) > MAX_WINDOW or not 0 <= new <= len(events):
        raise DecodeError(f"the event window holds {len(events)} events, {new} new: out of bounds")
    return new, events


def read_window(value: str, workspace_id: WorkspacePk | str, change_set_id: ChangeSetId | str) -> EventWindow:
    """A follower's reading of a ``Rebaser-Events`` value written for the change set ``workspace_id``/``change_set_id``
    (its subject's); :class:`~rebaser_core.errors.DecodeError` if it is not one (too long, not the form, an event not
    valid or naming a field the window's events share, ``seq`` not one after another)."""
    new, raw_events = _parsed(value)
    shared = {"workspace_id": str(workspace_id), "change_set_id": str(change_set_id), "durable": True}
    events: list[ChangeSetEvent] = []
    for item in raw_events:
        if not isinstance(item, dict) or not _SHARED.isdisjoint(item) or not _LONG.isdisjoint(item):
            raise DecodeError(
                "an event of the window is not valid: not an object, naming a field all share, or a field by the"
                " name its short one stands for"
            )
        fields = _long_form(item)
        fields.update(shared)
        try:
            event = ChangeSetEvent.model_validate(fields)
        except ValidationError as err:
            raise DecodeError(f"an event of the window is not valid: {err.errors()[0]['msg']}") from None
        if not event.durable or (events and event.seq != events[-1].seq + 1):
            raise DecodeError("the window's events are not durable ones numbered one after another")
        events.append(event)
    return EventWindow(new, tuple(events))


def _long_form(item: Mapping[str, object]) -> dict[str, object]:
    """An event of a window with its fields' own names and what it left out put back."""
    fields = {_LONG_NAMES.get(name, name): value for name, value in item.items()}
    kind = fields.setdefault("kind", _DEFAULT_KIND)
    if "at" not in fields and type(event_id := fields.get("id")) is str and _ULID.fullmatch(event_id):
        fields["at"] = ulid_milliseconds(event_id) / 1000
    if type(kind) is str:
        if "status" not in fields and kind in _STATUS:
            fields["status"] = _STATUS[kind]
        if "queued" not in fields and kind in _OUTCOMES:
            fields["queued"] = 0
    return fields


def split_window(value: str) -> tuple[str, ...]:
    """The daemon's reading of the window a record was stored with: its events as :func:`event_text` made them,
    to carry on. A window that does not read gives none (a follower then sees the gap).

    Read at every takeover: each event's text is cut out of the value where the JSON decoder ends it, not decoded
    and encoded again (a third of the time). A value not in the form :func:`window_header` writes is decoded whole."""
    head = _HEAD.match(value)
    if head is None or len(value) > MAX_WINDOW_BYTES:
        return _split_decoded(value)
    texts: list[str] = []
    at, end = head.end(), len(value) - 2
    if at == end and value.endswith("]}"):
        return ()
    while len(texts) < MAX_WINDOW:
        try:
            event, after = _DECODER.raw_decode(value, at)
        except ValueError:
            return ()
        if not isinstance(event, dict):
            return ()
        texts.append(value[at:after])
        if after == end and value.endswith("]}"):
            return tuple(texts)
        if value[after : after + 1] != ",":
            return ()
        at = after + 1
    return ()


def _split_decoded(value: str) -> tuple[str, ...]:
    try:
        _, events = _parsed(value)
    except DecodeError:
        return ()
    return tuple(event_text(e) for e in events if isinstance(e, dict))
