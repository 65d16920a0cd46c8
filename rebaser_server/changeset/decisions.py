"""What one request delivery comes to: the handler decides (:mod:`~rebaser_server.changeset.handling`), and one
post-process step carries it out (:mod:`~rebaser_server.changeset.postprocess`, with the commit group's flush).

A decision changes nothing by itself: it names the record as it is to be committed, the reply to send once it is,
the dead letter to write before it, and whether a DVU is due. So a decision taken by an owner that then loses the
change set (fenced, lease lost) is dropped whole, and nothing of it shows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from nats.aio.msg import Msg

from rebaser_core.api import EnqueueUpdatesResponse
from rebaser_server.changeset.outcome import PauseNow, Retry, Wedged
from rebaser_server.changeset.replies import UNCHECKED, Unchecked
from rebaser_server.record.model import ChangeSetRecord

__all__ = ["Decision", "Kind"]


class Kind(enum.Enum):
    """The ways one request delivery ends."""

    # Applied by the app: its reply (success, conflicts, or an error reply with a dead letter when the app refused it
    # for good or failed it max_attempts times), the new state, the request marked processed.
    APPLIED = "applied"
    # Answered from the record without applying it again: processed before (at or below the applied-through
    # watermark), or its id is remembered (a client resent it).
    REPLAYED = "replayed"
    # Never applied: undecodable, not for this change set, a reply inbox we may not publish to, or the request that
    # every owner died or froze on. An error reply and a dead letter; the request marked processed.
    REFUSED = "refused"
    # First in line after an unclean takeover: one more attempt counted against it and committed now, *before* it
    # is applied (if applying it kills this daemon too, the next owner sees the count); then it is decided again.
    COUNTED = "counted"
    # A retryable failure: the attempt counted and committed now (what came before is answered); the request stays
    # first in line and the task ends with ``error`` (retry after a backoff, or wedged).
    RETRY = "retry"


@dataclass(frozen=True, slots=True)
class Decision:
    kind: Kind
    # The delivery it is about: its stream sequence (removed from the stream once committed, unless the request
    # stays first in line), and the message (its headers say where to reply; a dead letter copies it).
    seq: int
    msg: Msg
    # The record as of this decision, for the commit (None: unchanged).
    record: ChangeSetRecord | None = None
    # The reply, sent after the commit (None: nothing to answer).
    response: EnqueueUpdatesResponse | None = None
    # Where to send it, if the handler checked the request's inbox already.
    inbox: str | Unchecked | None = UNCHECKED
    # Why the request is copied to the dead-letter stream (None: it is not), and where in the app it failed.
    dead_letter: str | None = None
    dvu: bool = False  # a dependent values update is due once committed
    error: Retry | Wedged | PauseNow | None = None  # RETRY: how the task ends once the attempt is committed
    trace: str | None = (
        None  # the app's frames of the exception that dead-lettered it (app_failures.app_trace)
    )

    @property
    def processed(self) -> bool:
        """The request is done with and leaves the stream once committed; COUNTED and RETRY keep it first in line."""
        return self.kind not in (Kind.COUNTED, Kind.RETRY)
