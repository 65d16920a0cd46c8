"""Event followers' consumers, made by the daemons on a follower's behalf.

A follower reads its workspace's events through an ordered push consumer: of the change-sets bucket's stream, whose
writes carry the events in a header (the record feed, rebaser_core.api.event_window), or of the events stream (the
feed of earlier releases, published with ``events`` on). Creating one is a
JetStream API request whose body names the subject JetStream pushes the events to (``deliver_subject``). A caller
allowed that request could have the events pushed into any subject of the daemons' account: a change-set record's
KV subject, another workspace's requests, where a stream would store them. So callers get no JetStream API at all.
The client sends its consumer-create request under the API prefix ``rebaser.api.follow.<wk>`` (nats-py's
``jetstream(prefix=...)``), and a daemon checks it and sends a request of its own making to JetStream:

- the consumer is of one of those streams, on that workspace's records or events (all of them, or one change
  set's), and nothing else: the workspace comes from the subject, which the caller's account imports for its own
  workspace only; a consumer of the records delivers their headers only (never a record's state or replies);
- its deliver subject is a reply inbox (``rebaser_core.inbox``): never a ``$`` subject nor one of the deployment's;
- it is an ordered consumer: ephemeral, in memory, one replica, no acks, flow control, bounded heartbeats; every
  other field is dropped.

JetStream's answer goes back as it is, so nats-py's ordered consumer (and its re-creation after a lost message)
works unchanged; a refusal is answered in JetStream's error form (code 400).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import OrderedDict, deque
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_core.errors import InvalidReplyInbox, InvalidSubject
from rebaser_core.inbox import check_reply_inbox
from rebaser_core.settings import Settings

__all__ = ["MAX_CREATE_BYTES", "MAX_FOLLOWED_WORKSPACES", "FollowerConsumers"]

log = logging.getLogger(__name__)

# A consumer-create request of nats-py is some 500 bytes; nothing longer is parsed.
MAX_CREATE_BYTES = 4096
# Workspaces whose consumer creations of the last minute a daemon keeps (follow_creates_per_minute is checked
# against them): each a deque of at most that many times.
MAX_FOLLOWED_WORKSPACES = 10_000
_CONSUMER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NANOS = 1_000_000_000
# Heartbeats between 1 s and 30 s (nats-py's ordered consumer sends 5 s); an idle consumer is gone 5 minutes at most
# after its follower stops listening.
_HEARTBEAT = (1 * _NANOS, 30 * _NANOS)
_MAX_INACTIVE = 300 * _NANOS
_POLICIES = {"all", "new", "last", "by_start_sequence", "by_start_time", "last_per_subject"}
_CREATE_RESPONSE = "io.nats.jetstream.api.v1.consumer_create_response"


class Refused(Exception):
    """A follower's request that is not an ordered consumer of its own workspace's events."""


class FollowerConsumers:
    """Answers ``rebaser.api.follow.<wk>.CONSUMER.CREATE.<stream>.<name>.<filter>`` requests."""

    def __init__(self, nc: NatsClient, settings: Settings) -> None:
        self._nc = nc
        self._settings = settings
        self._subjects = settings.subjects
        # workspace -> when this daemon made its consumers in the last minute (a follower cannot make the servers
        # hold consumers without bound: each lives until nobody listens for its inactivity threshold).
        self._recent: OrderedDict[Any, deque[float]] = OrderedDict()  # least recently created first
        self.created = 0
        self.refused = 0

    async def answer(self, msg: Msg) -> None:
        """Check ``msg`` (whose reply subject is already checked), create the consumer, answer on its reply."""
        try:
            subject, body = self._checked(msg)
        except Refused as err:
            self.refused += 1
            log.warning("refusing a follower's request on %s: %s", msg.subject[:200], err)
            await self._respond(msg, _error(400, 10003, f"rebaser refuses this follower request: {err}"))
            return
        workspace_id = self._subjects.parse_follow_api(msg.subject)[0]
        if not self._admit(workspace_id):
            self.refused += 1
            limit = self._settings.follow_creates_per_minute
            await self._respond(
                msg,
                _error(
                    429,
                    10077,
                    f"over {limit} consumers a minute for this workspace (follow_creates_per_minute)",
                ),
            )
            return
        try:
            answer = await self._nc.request(subject, body, timeout=self._settings.nats_timeout)
        except (nats.errors.Error, TimeoutError) as err:
            log.warning("a follower's consumer could not be created on %s: %r", subject[:200], err)
            await self._respond(msg, _error(503, 10039, f"the daemon could not create the consumer: {err!r}"))
            return
        self.created += 1
        await self._respond(msg, answer.data)

    def _admit(self, workspace_id: Any) -> bool:
        now = time.monotonic()
        recent = self._recent.get(workspace_id)
        if recent is None:
            recent = self._recent[workspace_id] = deque()
            # The map is bounded too: past MAX_FOLLOWED_WORKSPACES the workspace that created least recently goes
            # (one with no create for a minute loses nothing; one more recent could create its minute's count again,
            # which takes that many other workspaces creating since: a bound on memory, not a leak of the limit).
            while len(self._recent) > MAX_FOLLOWED_WORKSPACES:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(workspace_id)
        while recent and recent[0] < now - 60:
            recent.popleft()
        if len(recent) >= self._settings.follow_creates_per_minute:
            return False
        recent.append(now)
        return True

    @property
    def followed_workspaces(self) -> int:
        """Workspaces whose recent consumer creations this daemon keeps (at most MAX_FOLLOWED_WORKSPACES)."""
        return len(self._recent)

    def _checked(self, msg: Msg) -> tuple[str, bytes]:
        """The JetStream API subject and body to send for ``msg``, or :class:`Refused`."""
        try:
            workspace_id, api = self._subjects.parse_follow_api(msg.subject)
        except InvalidSubject as err:
            raise Refused(str(err)) from None
        records, events = self._subjects.records_stream, self._subjects.events_stream
        if len(api) < 5 or api[:2] != ["CONSUMER", "CREATE"] or api[2] not in (records, events):
            raise Refused(f"only CONSUMER.CREATE.<{records} or {events}>.<name>.<filter> is served")
        stream, name, filter_ = api[2], api[3], ".".join(api[4:])
        if not _CONSUMER_NAME.fullmatch(name):
            raise Refused("the consumer's name must be 1-64 letters, digits, '-' or '_'")
        self._check_filter(filter_, workspace_id, records=stream == records)
        if len(msg.data) > MAX_CREATE_BYTES:
            raise Refused(f"a request of {len(msg.data)} bytes is longer than {MAX_CREATE_BYTES}")
        try:
            request = json.loads(msg.data)
        except (ValueError, RecursionError):
            raise Refused("the request is not JSON") from None
        if not isinstance(request, dict) or request.get("stream_name") != stream:
            raise Refused(f"the request must name the stream {stream}")
        config = request.get("config")
        if not isinstance(config, dict):
            raise Refused("the request has no consumer config")
        safe = self._ordered_config(config, name, filter_)
        if stream == records:
            # The feed is in the writes' headers; a follower never gets the records themselves (their state and
            # replies), only what its workspace's writes carry in their headers.
            safe["headers_only"] = True
        body = json.dumps({"stream_name": stream, "config": safe}).encode()
        return f"$JS.API.CONSUMER.CREATE.{stream}.{name}.{filter_}", body

    def _check_filter(self, filter_: str, workspace_id: Any, *, records: bool) -> None:
        """``filter_`` is one change set's or the whole workspace's, of the records or of the events stream."""
        subjects, what = self._subjects, "records" if records else "events"
        whole = (
            subjects.records_of_workspace(workspace_id)
            if records
            else subjects.events_of_workspace(workspace_id)
        )
        if filter_ == whole:
            return
        try:
            parsed = subjects.parse_record_subject(filter_) if records else subjects.parse_events(filter_)
        except InvalidSubject:
            raise Refused(f"the filter must be the {what} of workspace {workspace_id}") from None
        if parsed.workspace_id != workspace_id:
            raise Refused(f"the filter must be the {what} of workspace {workspace_id}")

    def _ordered_config(self, config: dict[str, Any], name: str, filter_: str) -> dict[str, Any]:
        if config.get("name") != name:
            raise Refused("the config's name is not the subject's")
        filters = config.get("filter_subjects")
        if config.get("filter_subject") != filter_ or (filters and filters != [filter_]):
            raise Refused("the config's filter is not the subject's")
        if config.get("durable_name") or config.get("deliver_group"):
            raise Refused("a follower's consumer is ephemeral and has no queue group")
        deliver = config.get("deliver_subject")
        if not isinstance(deliver, str):
            raise Refused("the consumer needs a deliver subject (a push consumer)")
        try:
            check_reply_inbox(deliver, self._settings.reply_inbox_prefix, self._subjects)
        except InvalidReplyInbox as err:
            raise Refused(f"deliver subject: {err}") from None
        policy = config.get("deliver_policy", "all")
        if policy not in _POLICIES:
            raise Refused(f"deliver policy {str(policy)[:40]!r} is not one of {sorted(_POLICIES)}")
        safe: dict[str, Any] = {
            "name": name,
            "filter_subject": filter_,
            "deliver_subject": deliver,
            "deliver_policy": policy,
            "ack_policy": "none",
            "max_deliver": 1,
            "replay_policy": "instant",
            "flow_control": True,
            "idle_heartbeat": _nanos(config.get("idle_heartbeat"), *_HEARTBEAT, default=5 * _NANOS),
            "inactive_threshold": _nanos(
                config.get("inactive_threshold"), _NANOS, _MAX_INACTIVE, default=5 * _NANOS
            ),
            "headers_only": bool(config.get("headers_only", False)),
            "mem_storage": True,
            "num_replicas": 1,
        }
        if policy == "by_start_sequence":
            start = config.get("opt_start_seq")
            if not isinstance(start, int) or isinstance(start, bool) or start < 0:
                raise Refused("by_start_sequence needs a whole opt_start_seq")
            safe["opt_start_seq"] = start
        if policy == "by_start_time":
            start_time = config.get("opt_start_time")
            if not isinstance(start_time, str) or len(start_time) > 64:
                raise Refused("by_start_time needs an opt_start_time")
            safe["opt_start_time"] = start_time
        return safe

    async def _respond(self, msg: Msg, body: bytes) -> None:
        try:
            await self._nc.publish(msg.reply, body)
        except nats.errors.Error as err:
            log.warning("could not answer a follower's request: %r", err)


def _nanos(value: Any, low: int, high: int, *, default: int) -> int:
    """A duration in nanoseconds (JetStream's unit) held within ``low`` and ``high``."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return default
    return max(low, min(high, value))


def _error(code: int, err_code: int, description: str) -> bytes:
    return json.dumps(
        {
            "type": _CREATE_RESPONSE,
            "error": {"code": code, "err_code": err_code, "description": description[:400]},
        }
    ).encode()
