"""What every owned change set of one daemon uses: :class:`Owning`, made once by the daemon and handed to each
change set's processor, which passes on to every piece below it only what that piece uses."""

from __future__ import annotations

from dataclasses import dataclass

from rebaser_core.settings import Settings
from rebaser_server.app import ChangeSetReader, RebaserApp
from rebaser_server.changeset.context import Nats, Pauses, Placement, Report
from rebaser_server.changeset.replies import Replies
from rebaser_server.record.store import ChangeSetStore
from rebaser_server.task.heartbeat import Heartbeat
from rebaser_server.task.keeper import LeaseKeeper

__all__ = ["Owning"]


@dataclass(frozen=True, slots=True)
class Owning:
    """What every owned change set of one daemon uses, made once by the daemon. The processor passes on to each
    piece below it only what that piece uses."""

    nats: Nats
    settings: Settings
    app: RebaserApp
    store: ChangeSetStore  # the change sets' records
    owner: str  # this daemon's name in the records it acquires
    keeper: LeaseKeeper  # renews every owned change set's lease, runs their watchdog
    replies: Replies
    report: Report
    placement: Placement
    reader: ChangeSetReader  # what the app may read besides its change set (given with each ChangeSet)
    pauses: Pauses  # paused change sets and workspaces
    # lease_mode daemon: the daemon's heartbeat, which bounds every lease too (rebaser_server.task.heartbeat).
    heartbeat: Heartbeat | None = None
