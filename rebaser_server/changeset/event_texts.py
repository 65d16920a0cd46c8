"""A commit's durable events written straight as the text the record feed carries (rebaser_core.api.event_window),
without a dict or an encoder in between: with the events stream off (the default) nothing else needs them, and
built that way they cost a fraction of it on every request. ``events.py`` builds the same events as dicts when the
events stream is on; the tests hold both forms to the wire model, and to each other.
"""

from __future__ import annotations

from json.encoder import encode_basestring_ascii as json_string

from rebaser_core.api import ConflictsStatus, SuccessStatus, reason_class
from rebaser_core.api.event_window import STATUS_OF_KIND
from rebaser_core.ids import new_unordered_ulid_text
from rebaser_server.changeset.decisions import Decision, Kind

__all__ = ["SETTLED", "dvu_text", "outcome_text"]

# What a settled event's text ends with instead of its closing brace.
SETTLED = ',"z":true}'
_ADDRESS = 512  # characters of a snapshot address kept (ChangeSetEvent's bound)
_KIND = {status: kind for kind, status in STATUS_OF_KIND.items()}  # a status -> its outcome event's kind
_NO_EVENT = (Kind.REPLAYED, Kind.COUNTED, Kind.RETRY)  # answered from the record, or not processed yet


def outcome_text(decision: Decision, queued: int, epoch: int, seq: int) -> str | None:
    """The event of a decided request as durable event ``seq``, or None if it has none (answered from the record:
    its event was told when it was first processed). One f-string per kind: this runs for every request. In the
    window's short form (rebaser_core.api.event_window), whose reader puts back what it leaves out."""
    response = decision.response
    if response is None or decision.record is None or decision.kind in _NO_EVENT:
        return None
    status = response.status
    event_id, request_id = new_unordered_ulid_text(), response.id.text
    head = f'"id":"{event_id}","e":{epoch},"n":{seq},"r":"{request_id}"'
    if queued:
        head = f'{head},"q":{queued}'
    if decision.dead_letter is not None:
        return (
            f'{{"k":"dead_lettered",{head},"s":"{status.kind}",'
            f'"y":{json_string(reason_class(decision.dead_letter))}}}'
        )
    if type(status) is SuccessStatus:
        address = status.snapshot_address
        if address is None:
            return f'{{{head},"u":{status.updates_performed}}}'
        return f'{{{head},"u":{status.updates_performed},"a":{json_string(address[:_ADDRESS])}}}'
    if type(status) is ConflictsStatus:
        return f'{{"k":"conflicts",{head},"c":{len(status.conflicts)}}}'
    return f'{{"k":"{_KIND[status.kind]}",{head}}}'


def dvu_text(duration: float, epoch: int, seq: int) -> str:
    """The ``dvu_finished`` event of a DVU run as durable event ``seq`` (in the short form, as above)."""
    return (
        f'{{"k":"dvu_finished","id":"{new_unordered_ulid_text()}","e":{epoch},"n":{seq},'
        f'"d":{round(max(duration, 0.0), 6)!r}}}'
    )
