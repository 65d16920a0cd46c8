"""Every error rebaser raises, in one hierarchy.

Catch the narrowest class that tells you what to do next::

    RebaserError
    ├── InvalidId                      not a valid ULID id (also a ValueError)
    ├── InvalidSubject                 not a safe NATS subject token or prefix (also a ValueError)
    ├── InvalidUrl                     not a NATS server URL nats-py can connect with (also a ValueError)
    ├── ProtocolError                  a message broke the wire contract
    │   ├── MissingHeader              a required header is absent
    │   ├── DecodeError                the body could not be decoded into the announced message
    │   ├── InvalidReplyInbox          the reply inbox is not one the daemon may publish to
    │   ├── HeadersTooLarge            the header block exceeds its documented limit
    │   └── Unsupported                well-formed, but this side does not speak it
    │       ├── UnsupportedContentType
    │       ├── UnsupportedMessageType
    │       └── UnsupportedMessageVersion
    ├── ClientError                    raised by rebaser_client
    │   ├── RebaserTimeout             no reply before the deadline (the request may still be applied)
    │   │   └── StillHeld              paused, but a daemon still held the change set when the wait ran out
    │   ├── RebaserRefused             refused (the request, or an operator's operation): nothing was done
    │   │   ├── RebaserBusy            back-pressure (``limit`` says which); retry after ``retry_after`` seconds
    │   │   ├── BatchTooLarge          a stored batch over the size limits (``limit``); nothing was stored
    │   │   ├── NotPaused              skipping a request of a change set that is not paused
    │   │   ├── HeldByDaemon           skipping while a daemon still holds the paused change set: try again
    │   │   └── NotFirstInLine         skipping a request that is not first in line (``found``: the first one)
    │   ├── RebaserUnavailable         NATS or JetStream cannot be reached
    │   ├── EventsLost                 a change set's event feed skipped events (``lost``); it goes on after them
    │   └── SpoolError                 the client's local spool file cannot be used (locked by another client)
    ├── ApplicationError               raised by an app while applying a request
    │   ├── RefusedError               the request is wrong (a bad quantity): a "refused" reply, no dead letter
    │   ├── RetryableError             transient: the task is retried later, the request stays first
    │   └── UnprocessableError         an operator must look: the request is dead-lettered with an error reply
    ├── FencedError                    this daemon no longer owns the change set; its commit was refused
    ├── LayoutMismatch                 a flag disagrees with the cluster's shard layout, or a layout change is unsafe
    │   └── LayoutUnreadable           the cluster's layout entry cannot be read (``rebaser streams repair``)
    ├── DurabilityTooLow               acknowledgements would survive less than ``require_durability`` asks
    └── EmbeddedServerError            the embedded nats-server could not be started or stopped
        ├── NatsServerNotFound         the nats-server binary is not installed
        └── StoreInUse                 another process runs a server on this store (``holder_pid``)
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = [  # classes only (BusyLimit, a type alias, is importable but not listed: the tree lists classes)
    "ApplicationError",
    "BatchTooLarge",
    "ClientError",
    "DecodeError",
    "DurabilityTooLow",
    "EmbeddedServerError",
    "EventsLost",
    "FencedError",
    "HeadersTooLarge",
    "HeldByDaemon",
    "InvalidId",
    "InvalidReplyInbox",
    "InvalidSubject",
    "InvalidUrl",
    "LayoutMismatch",
    "LayoutUnreadable",
    "MissingHeader",
    "NatsServerNotFound",
    "NotFirstInLine",
    "NotPaused",
    "ProtocolError",
    "RebaserBusy",
    "RebaserError",
    "RebaserRefused",
    "RebaserTimeout",
    "RebaserUnavailable",
    "RefusedError",
    "RetryableError",
    "SpoolError",
    "StillHeld",
    "StoreInUse",
    "UnprocessableError",
    "Unsupported",
    "UnsupportedContentType",
    "UnsupportedMessageType",
    "UnsupportedMessageVersion",
]


class RebaserError(Exception):
    """Base class of every error raised by rebaser."""


class InvalidId(RebaserError, ValueError):
    """A value that should be a ULID id (workspace, change set, request) is not one."""


class InvalidSubject(RebaserError, ValueError):
    """A subject token or prefix would change the meaning of a NATS subject."""


class InvalidUrl(RebaserError, ValueError):
    """A NATS server URL with a scheme other than ``nats://``, ``tls://``, ``ws://`` or ``wss://``, or no host."""


class ProtocolError(RebaserError):
    """A message on the wire does not follow the protocol (see ``docs/protocol.md``)."""


class MissingHeader(ProtocolError):
    def __init__(self, header: str) -> None:
        super().__init__(f"required header {header!r} is missing")
        self.header = header


class DecodeError(ProtocolError):
    """The body is garbled or does not match the schema its headers announce."""


class InvalidReplyInbox(ProtocolError):
    """A reply inbox the daemon must not publish to (see ``rebaser_core.inbox``): the request gets no reply."""


class HeadersTooLarge(ProtocolError):
    """The message's header block is over ``rebaser_core.headers.MAX_HEADER_BYTES``."""


class Unsupported(ProtocolError):
    """The message is well-formed but uses something this side does not support."""


class UnsupportedContentType(Unsupported):
    def __init__(self, content_type: str, supported: tuple[str, ...]) -> None:
        super().__init__(f"unsupported content type {content_type!r}; supported: {', '.join(supported)}")
        self.content_type = content_type
        self.supported = supported


class UnsupportedMessageType(Unsupported):
    def __init__(self, message_type: str, expected: str) -> None:
        super().__init__(f"unsupported message type {message_type!r}; expected {expected!r}")
        self.message_type = message_type
        self.expected = expected


class UnsupportedMessageVersion(Unsupported):
    def __init__(self, message_type: str, version: str, supported: tuple[int, ...]) -> None:
        versions = ", ".join(str(v) for v in supported)
        super().__init__(f"unsupported version {version!r} of {message_type}; supported: {versions}")
        self.message_type = message_type
        self.version = version
        self.supported = supported


class ClientError(RebaserError):
    """Raised by :mod:`rebaser_client`."""


class RebaserTimeout(ClientError, TimeoutError):
    """No reply arrived in time. The request is durable and may still be applied later."""


class StillHeld(RebaserTimeout):
    """Paused, but a daemon still held the change set (or one of the workspace's) when the wait ran out: it lets go
    at its next request boundary (a request being applied is finished first). The pause stays."""


class RebaserRefused(ClientError):
    """The server refused to accept the request (it was not enqueued), or the client refused an operator's operation
    whose conditions do not hold (a skip, say): nothing was done."""


BusyLimit = Literal[
    "change_set",
    "stream_messages",
    "stream_bytes",
    "tasks_messages",
    "tasks_bytes",
    "workspace_requests",
    "stream",
    "in_flight",
    "spool",
    "stored_batches",
    "queries",
]
"""Which limit refused a request: this change set's backlog (``requests_max_msgs_per_change_set``), the requests
stream's message or byte cap, the tasks stream's (``tasks_max_msgs``, ``tasks_max_bytes``: the request was stored,
its task was not; sending it again with the same id is safe), the workspace's queued requests
(``workspace_max_requests``, checked by the client before it publishes), an unrecognised stream limit, the client's
``max_in_flight`` publishes, its full spool, or (storing a batch) the full stored batches stream
(``stored_batches_max_msgs``, ``stored_batches_max_bytes``), or (a query) the daemon that answers as many queries
as it may at once."""


class RebaserBusy(RebaserRefused):
    """Refused for back-pressure: nothing was enqueued; trying again after ``retry_after`` seconds is expected to
    work. ``limit`` names the limit that refused it (see :data:`BusyLimit`); ``workspace`` the workspace over its
    own limit (``workspace_requests``), else None: any other limit is shared by every workspace."""

    def __init__(
        self, message: str, retry_after: float, limit: BusyLimit = "stream", workspace: str | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.limit: BusyLimit = limit
        self.workspace = workspace


class BatchTooLarge(RebaserRefused):
    """A batch has more updates (``limit == "updates"``) or bytes (``"bytes"``) than a stored batch may have
    (``size`` > ``maximum``); nothing was stored. Split it into several requests."""

    def __init__(self, message: str, limit: Literal["updates", "bytes"], size: int, maximum: int) -> None:
        super().__init__(message)
        self.limit: Literal["updates", "bytes"] = limit
        self.size = size
        self.maximum = maximum


class NotPaused(RebaserRefused):
    """Skipping a request of a change set that is not paused: the daemons may be applying it right now."""

    def __init__(self, workspace_id: object, change_set_id: object) -> None:
        super().__init__(
            f"change set {workspace_id}/{change_set_id} is not paused: pause it first "
            f"(rebaser change-set pause {workspace_id} {change_set_id})"
        )


class HeldByDaemon(RebaserRefused):
    """A daemon still holds the paused change set (it lets go at its next request boundary): try again."""


class NotFirstInLine(RebaserRefused):
    """The request to skip is not the change set's first queued one (``found``: the first one's id, None if nothing
    is queued or its id cannot be read; ``seq``: its sequence, 0 if nothing is queued)."""

    def __init__(
        self, workspace_id: object, change_set_id: object, request_id: str, found: str | None, seq: int
    ) -> None:
        where = f"{workspace_id}/{change_set_id}"
        if seq == 0:
            what = f"nothing is queued for change set {where}"
        elif found is None:
            what = f"the first request queued for {where} (seq {seq}) has no readable id"
        else:
            what = f"the first request queued for {where} is {found} (seq {seq})"
        super().__init__(f"request {request_id} is not first in line: {what}")
        self.found = found
        self.seq = seq


class RebaserUnavailable(ClientError):
    """NATS or JetStream could not be reached in time, so the request was not acknowledged.

    Usually nothing was enqueued (the client fails fast while disconnected). After a publish that went out but got
    no acknowledgement in time, the request may still have been stored; sending it again with the same request id
    is safe, since the stream drops a repeated ``Nats-Msg-Id`` within its duplicate window.
    """


class EventsLost(ClientError):
    """A change set's event feed skipped durable events: ``lost`` of them, ``expected`` to ``got - 1`` (older than
    the stream keeps, or given up while NATS was down). Iterating on goes on from ``got``."""

    def __init__(self, workspace_id: object, change_set_id: object, *, expected: int, got: int) -> None:
        self.workspace_id, self.change_set_id = workspace_id, change_set_id
        self.expected, self.got, self.lost = expected, got, got - expected
        super().__init__(
            f"{workspace_id}/{change_set_id}: {self.lost} events lost (seq {expected} to {got - 1}); "
            f"the feed goes on from seq {got}"
        )


class SpoolError(ClientError):
    """The client's spool file cannot be opened: another client holds it, or it is not a usable SQLite file."""


class ApplicationError(RebaserError):
    """Raised by an application's ``apply`` to classify a failure."""


class RefusedError(ApplicationError):
    """The request is wrong, and applying it again would be wrong again: a validation error, a rule of the
    application. The caller gets a ``refused`` reply with ``message`` and ``details`` (a JSON object, at most
    4 KiB as JSON, for a program to read); the refusal is committed like any outcome (a resent request gets the
    same reply) and nothing is dead-lettered. The change set's state is left as it was."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class RetryableError(ApplicationError):
    """A transient failure: the change set's task is retried with backoff; the request stays first in line."""


class UnprocessableError(ApplicationError):
    """A permanent failure: the request goes to the dead-letter stream and its caller gets an error reply."""


class FencedError(RebaserError):
    """Another daemon took this change set over; the commit of this (stale) owner was refused."""


class LayoutMismatch(RebaserError):
    """A ``--streams`` or ``--assignment`` flag disagrees with the cluster's layout, or a layout is refused."""


class LayoutUnreadable(LayoutMismatch):
    """The cluster's layout entry holds something that is not a layout (a bug, or someone else wrote it). A daemon
    waits for it to be repaired (``rebaser streams repair`` rewrites it from the streams that exist) instead of
    guessing a layout: routing by a wrong one would give a change set two owners."""


class DurabilityTooLow(RebaserError):
    """The NATS servers and streams promise less for an acknowledged request than ``require_durability`` asks."""


class EmbeddedServerError(RebaserError):
    """The embedded ``nats-server`` failed to start, to become ready, or to stop."""


class NatsServerNotFound(EmbeddedServerError, FileNotFoundError):
    """The ``nats-server`` binary is not installed."""


class StoreInUse(EmbeddedServerError):
    """Another process runs an embedded ``nats-server`` on this store (two servers on one store corrupt it)."""

    def __init__(self, message: str, *, store_dir: str, holder_pid: int | None) -> None:
        super().__init__(message)
        self.store_dir = store_dir
        self.holder_pid = holder_pid
