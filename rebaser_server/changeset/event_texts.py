"""A commit's durable events written straight as the text the record feed carries (rebaser_core.api.event_window),
without a dict or an encoder in between: with the events stream off (the default) nothing else needs them, and
built that way they cost a fraction of it on every request. ``events.py`` builds the same events as dicts when the
events stream is on; the tests hold both forms to the wire model, and to each other.
"""

from __future__ import annotations

from json.encoder import encode_basestring_ascii as json_string

from rebaser_core.api import ConflictsStatus, SuccessStatus, reason_class
from rebaser_core.ids import new_ulid_stamp
from rebaser_server.changeset.decisions import Decision, Kind

__all__ = ["SETTLED", "dvu_text", "outcome_text"]

# What a settled event's text ends with instead of its closing brace.
SETTLED = ',"settled":true}'
_ADDRESS = 512  # characters of a snapshot address kept (ChangeSetEvent's bound)
_KIND = {"success": "applied", "conflicts": "conflicts", "refused": "refused", "error": "error_reply"}
_NO_EVENT = (Kind.REPLAYED, Kind.COUNTED, Kind.RETRY)  # answered from the record, or not processed yet


def outcome_text(decision: Decision, queued: int, epoch: int, seq: int) -> str | None:
    """The event of a decided request as durable event ``seq``, or None if it has none (answered from the record:
    its event was told when it was first processed). One f-string per kind: this runs for every request."""
    response = decision.response
    if response is None or decision.record is None or decision.kind in _NO_EVENT:
        return None
    status = response.status
    # The event's time is its id's millisecond (a float's repr costs more than the id).
    event_id, at = new_ulid_stamp()
    common = (
        f'"id":"{event_id}","at":{at},"epoch":{epoch},"seq":{seq},'
        f'"request_id":"{response.id}","status":"{status.kind}","queued":{queued}'
    )
    if decision.dead_letter is not None:
        return (
            f'{{"kind":"dead_lettered",{common},"reason":{json_string(reason_class(decision.dead_letter))}}}'
        )
    if type(status) is SuccessStatus:
        address = status.snapshot_address
        if address is None:
            return f'{{"kind":"applied",{common},"updates_performed":{status.updates_performed}}}'
        return (
            f'{{"kind":"applied",{common},"updates_performed":{status.updates_performed},'
            f'"snapshot_address":{json_string(address[:_ADDRESS])}}}'
        )
    if type(status) is ConflictsStatus:
        return f'{{"kind":"conflicts",{common},"conflicts":{len(status.conflicts)}}}'
    return f'{{"kind":"{_KIND[status.kind]}",{common}}}'


def dvu_text(duration: float, epoch: int, seq: int) -> str:
    """The ``dvu_finished`` event of a DVU run as durable event ``seq``."""
    event_id, at = new_ulid_stamp()
    return (
        f'{{"kind":"dvu_finished","id":"{event_id}","at":{at},"epoch":{epoch},"seq":{seq},'
        f'"duration_s":{round(max(duration, 0.0), 6)!r}}}'
    )
