"""NATS subjects and stream names, with the optional per-deployment prefix.

With prefix ``P`` every subject gains a leading ``P.`` token and every stream name a leading ``P_``
(docs/design.md §1); tests give each test its own prefix so their streams never collide.

================  =================================================
requests          ``[P.]rebaser.requests.<workspace>.<change_set>``
tasks             ``[P.]rebaser.tasks.<workspace>.<change_set>.process`` (stored as ``….<lane>`` with the lanes intake)
dead letters      ``[P.]dlq.rebaser.requests.<workspace>.<change_set>`` (``….malformed`` for junk subjects)
queries           ``[P.]rebaser.api.<get|fork>.<workspace>.<change_set>`` (core NATS request/reply)
events            ``[P.]rebaser.events.<workspace>.<change_set>`` (one stream, whatever the shards)
stored batches    ``[P.]rebaser.batches.<workspace>.<address>.<part|manifest>`` (one stream, rebaser_core.batches)
audit trail       ``[P.]rebaser.audit.<action>`` (operators' actions, rebaser_client.admin.audit)
================  =================================================

**Shards** (docs/operations.md): with ``--streams N`` requests and tasks are spread over N streams each. Shard 0
keeps the names above, so a deployment of one stream is exactly what it always was; shard ``k`` >= 1 has streams
``[P_]REBASER_REQUESTS_<k>`` / ``[P_]REBASER_TASKS_<k>`` and one more subject token after ``requests``/``tasks``:
``[P.]rebaser.requests.<k>.<workspace>.<change_set>``. That token makes the shards' subject spaces disjoint
(a stream's subjects may not overlap another's) without touching shard 0's. Which shard a change set is in is
:func:`rebaser_core.layout.shard_of`.

Reading a subject back (the change set, workspace or shard it names) is :mod:`rebaser_core.subject_parsing`, the
base of :class:`Subjects`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rebaser_core.errors import InvalidSubject
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.subject_parsing import ParsedSubject, SubjectParsing

__all__ = ["Subjects", "lane_of", "validate_prefix"]

# Letters, digits, '-' and '_' are safe in subject tokens *and* in stream, consumer and bucket names.
_PREFIX_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")
_PARTITION = re.compile(r"\{\{partition\((\d+),1\)\}\}")

REQUESTS_STREAM = "REBASER_REQUESTS"
TASKS_STREAM = "REBASER_TASKS"
DEAD_LETTER_STREAM = "REBASER_DEAD_LETTERS"
CHANGE_SETS_BUCKET = "REBASER_CHANGE_SETS"
SNAPSHOTS_BUCKET = "REBASER_SNAPSHOTS"
BATCHES_BUCKET = "REBASER_BATCHES"
STORED_BATCHES_STREAM = "REBASER_STORED_BATCHES"
TASKS_CONSUMER = "rebaser-tasks"
LANE_CONSUMER = "rebaser-lane"
LAYOUT_BUCKET = "REBASER_LAYOUT"
PAUSES_BUCKET = "REBASER_PAUSES"
DAEMONS_BUCKET = "REBASER_DAEMONS"
EVENTS_STREAM = "REBASER_EVENTS"
AUDIT_STREAM = "REBASER_AUDIT"
LAYOUT_KEY = "layout"


def lane_of(workspace_id: object, lanes: int) -> int:
    """The lane of a workspace among ``lanes``, as nats-server's ``{{partition(lanes,1)}}`` computes it: FNV-1a
    (32 bits) of the workspace token, modulo ``lanes``."""
    value = 0x811C9DC5
    for byte in str(workspace_id).encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value % lanes


def validate_prefix(prefix: str | None) -> str | None:
    """Return ``prefix`` if it is one safe token (or ``None``/empty for no prefix); else raise."""
    if prefix is None or prefix == "":
        return None
    if prefix == "dlq":
        # "dlq.rebaser.requests.>" is the unprefixed dead-letter stream's subject space.
        raise InvalidSubject("subject prefix 'dlq' is reserved")
    if not _PREFIX_TOKEN.fullmatch(prefix):
        raise InvalidSubject(
            f"subject prefix {prefix!r} must be one token of letters, digits, '-' or '_' "
            "(no '.', '*', '>', whitespace or empty tokens)"
        )
    return prefix


@dataclass(frozen=True, slots=True)
class Subjects(SubjectParsing):
    """All names for one deployment (one prefix). Build with ``Subjects(prefix)``."""

    prefix: str | None = None
    shard: int = 0
    # Made once: a client names a request's subject, its task's and its stream on every request.
    _requests_head: str = field(init=False, repr=False, compare=False)
    _tasks_head: str = field(init=False, repr=False, compare=False)
    _requests_stream: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", validate_prefix(self.prefix))
        if self.shard < 0:
            raise InvalidSubject(f"shard {self.shard} must be >= 0")
        object.__setattr__(self, "_requests_head", self._sharded("requests") + ".")
        object.__setattr__(self, "_tasks_head", self._sharded("tasks") + ".")
        object.__setattr__(self, "_requests_stream", self._shard_name(REQUESTS_STREAM))

    def for_shard(self, shard: int) -> Subjects:
        """The names of shard ``shard`` of this deployment (streams and request/task subjects differ per shard;
        dead letters, records, queries and object stores are shared by all shards)."""
        return self if shard == self.shard else Subjects(self.prefix, shard)

    def _sharded(self, kind: str, *tokens: str) -> str:
        """A request or task subject: ``rebaser.<kind>[.<shard>].…`` (shard 0 has no shard token)."""
        head = ("rebaser", kind, str(self.shard)) if self.shard else ("rebaser", kind)
        return self._subject(*head, *tokens)

    def _shard_name(self, name: str) -> str:
        return self._name(f"{name}_{self.shard}" if self.shard else name)

    def _subject(self, *tokens: str) -> str:
        return ".".join((self.prefix, *tokens) if self.prefix else tokens)

    def _name(self, name: str) -> str:
        return f"{self.prefix}_{name}" if self.prefix else name

    # -- stream, consumer and bucket names ------------------------------------------------------
    @property
    def requests_stream(self) -> str:
        return self._requests_stream

    @property
    def tasks_stream(self) -> str:
        return self._shard_name(TASKS_STREAM)

    @property
    def dead_letter_stream(self) -> str:
        return self._name(DEAD_LETTER_STREAM)

    @property
    def change_sets_bucket(self) -> str:
        return self._name(CHANGE_SETS_BUCKET)

    @property
    def events_stream(self) -> str:
        """The change sets' event feed (rebaser_core.api.events): one stream for every shard, so a change set's
        feed never moves when the shard layout changes, and one consumer follows a whole workspace."""
        return self._name(EVENTS_STREAM)

    @property
    def pauses_bucket(self) -> str:
        """KV bucket of paused change sets and workspaces (rebaser_core.pauses)."""
        return self._name(PAUSES_BUCKET)

    @property
    def daemons_bucket(self) -> str:
        """KV bucket of the daemons' heartbeats (``lease_mode`` daemon: rebaser_server.task.liveness)."""
        return self._name(DAEMONS_BUCKET)

    @property
    def layout_bucket(self) -> str:
        """KV bucket holding the shard layout (one key, ``layout``): see rebaser_core.layout."""
        return self._name(LAYOUT_BUCKET)

    @property
    def layout_key(self) -> str:
        return LAYOUT_KEY

    @property
    def snapshots_bucket(self) -> str:
        """Object store of the built-in app's snapshots (content-addressed, written once)."""
        return self._name(SNAPSHOTS_BUCKET)

    @property
    def batches_bucket(self) -> str:
        """The first layout's object store of stored update batches, named by content address alone: daemons
        still read a batch from it when their workspace's stream has none (docs/protocol.md §14)."""
        return self._name(BATCHES_BUCKET)

    @property
    def stored_batches_stream(self) -> str:
        """Stored update batches (the v3 ``stored`` updates kind), each under its workspace (rebaser_core.batches)."""
        return self._name(STORED_BATCHES_STREAM)

    @property
    def stored_batches_subject(self) -> str:
        """What the stored-batches stream stores: ``rebaser.batches.<wk>.<address>.<part>``."""
        return self._subject("rebaser", "batches", "*", "*", "*")

    def batch_part(self, workspace_id: WorkspacePk, address: str, part: int | str) -> str:
        """Part ``part`` (0, 1, …) of a workspace's stored batch, or its ``manifest`` (written last)."""
        return self._subject("rebaser", "batches", str(workspace_id), address, str(part))

    @property
    def audit_stream(self) -> str:
        """The operators' audit trail: one message per action of the console or the ``rebaser`` commands
        (rebaser_client.admin.audit)."""
        return self._name(AUDIT_STREAM)

    @property
    def audit_all(self) -> str:
        """What the audit stream stores: ``rebaser.audit.<action>``."""
        return self._subject("rebaser", "audit", "*")

    def audit(self, action: str) -> str:
        """Where one action (a subject token: letters, digits, '-' and '_') is recorded."""
        return self._subject("rebaser", "audit", action)

    @property
    def tasks_consumer(self) -> str:
        return TASKS_CONSUMER

    @staticmethod
    def workspace_tasks_consumer(workspace_id: WorkspacePk) -> str:
        """Fair intake: the durable consumer of one workspace's tasks (in its shard's tasks stream)."""
        return f"{TASKS_CONSUMER}-{workspace_id}"

    # -- stream subject filters -----------------------------------------------------------------
    @property
    def requests_all(self) -> str:
        """Everything under the requests subject space (for listing, including subjects stored by older
        stream configurations that took any number of tokens)."""
        return self._sharded("requests", ">")

    @property
    def tasks_all(self) -> str:
        return self._sharded("tasks", ">")

    @property
    def requests_stream_subject(self) -> str:
        """What the requests stream stores: exactly two tokens after ``rebaser.requests``, so a request on a
        subject with more or fewer tokens is refused by JetStream instead of stored for good."""
        return self._sharded("requests", "*", "*")

    @property
    def tasks_stream_subject(self) -> str:
        """What the tasks stream stores: ``rebaser.tasks.<wk>.<cs>.process`` and nothing else."""
        return self._sharded("tasks", "*", "*", "process")

    @property
    def tasks_filter(self) -> str:
        """The shared tasks consumer's filter (exactly the task subjects, nothing else)."""
        return self._sharded("tasks", "*", "*", "*")

    @property
    def dead_letters_all(self) -> str:
        return self._subject("dlq", "rebaser", "requests", ">")

    # -- per change set ---------------------------------------------------------------------------
    def requests(self, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
        return f"{self._requests_head}{workspace_id}.{change_set_id}"

    def requests_of_workspace(self, workspace_id: WorkspacePk) -> str:
        """The filter of every change set's requests of one workspace (in this shard)."""
        return f"{self._requests_head}{workspace_id}.*"

    def tasks_of_workspace(self, workspace_id: WorkspacePk) -> str:
        """Fair intake: the filter of one workspace's consumer, every change set's task of it (in this shard)."""
        return f"{self._tasks_head}{workspace_id}.*.process"

    def task(self, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
        """Where a change set's task is published (and stored, but with the lanes intake: :meth:`stored_task`)."""
        return f"{self._tasks_head}{workspace_id}.{change_set_id}.process"

    def stored_task(self, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
        """The filter of a change set's task as the tasks stream stores it, whatever the intake: with the lanes
        intake the stream replaces ``process`` with the workspace's lane (:meth:`tasks_transform`)."""
        return f"{self._tasks_head}{workspace_id}.{change_set_id}.*"

    def stored_tasks_of_workspace(self, workspace_id: WorkspacePk) -> str:
        """The filter of one workspace's tasks as stored, whatever the intake."""
        return f"{self._tasks_head}{workspace_id}.*.*"

    # -- the lanes intake -----------------------------------------------------------------------------
    def tasks_transform(self, lanes: int) -> tuple[str, str]:
        """The tasks stream's subject transform with ``lanes`` lanes (source, destination): a task is stored under
        ``….<wk>.<cs>.<lane>``, its lane nats-server's ``partition`` of the workspace token (:func:`lane_of`)."""
        return (
            self.tasks_stream_subject,
            self._sharded("tasks", "{{wildcard(1)}}", "{{wildcard(2)}}", f"{{{{partition({lanes},1)}}}}"),
        )

    @staticmethod
    def transform_lanes(destination: str) -> int | None:
        """The lanes of a tasks stream's transform destination (:meth:`tasks_transform`); None if it has none."""
        found = _PARTITION.search(destination)
        return int(found.group(1)) if found else None

    def lane_tasks(self, lane: int) -> str:
        """The filter of one lane's consumer: the tasks stored under lane ``lane``."""
        return self._sharded("tasks", "*", "*", str(lane))

    @staticmethod
    def lane_consumer(lane: int) -> str:
        """The durable consumer of one lane's tasks (in its shard's tasks stream)."""
        return f"{LANE_CONSUMER}-{lane}"

    def dead_letter(self, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
        return self._subject("dlq", "rebaser", "requests", str(workspace_id), str(change_set_id))

    def dead_letters_of_workspace(self, workspace_id: WorkspacePk) -> str:
        """The filter of every change set's dead letters of one workspace."""
        return self._subject("dlq", "rebaser", "requests", str(workspace_id), "*")

    def events(self, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
        """Where the events of one change set are published."""
        return self._subject("rebaser", "events", str(workspace_id), str(change_set_id))

    def events_of_workspace(self, workspace_id: WorkspacePk) -> str:
        """The filter of every change set's events in one workspace."""
        return self._subject("rebaser", "events", str(workspace_id), "*")

    @property
    def events_stream_subject(self) -> str:
        return self._subject("rebaser", "events", "*", "*")

    # -- the record feed: the change-sets bucket's stream (rebaser_core.api.event_window) --------------------------
    @property
    def records_stream(self) -> str:
        """The stream of the change-sets KV bucket: one message per record write, each carrying the change set's
        last events in a header (the event feed)."""
        return f"KV_{self.change_sets_bucket}"

    def record_subject(self, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
        """The subject of a change set's record writes."""
        return f"$KV.{self.change_sets_bucket}.{self.change_set_key(workspace_id, change_set_id)}"

    def records_of_workspace(self, workspace_id: WorkspacePk) -> str:
        """The filter of every change set's record writes in one workspace."""
        return f"$KV.{self.change_sets_bucket}.{workspace_id}.*"

    @property
    def records_all(self) -> str:
        return f"$KV.{self.change_sets_bucket}.*.*"

    def parse_record_subject(self, subject: str) -> ParsedSubject:
        """The change set a record write's subject names; :class:`InvalidSubject` if it is not one."""
        head = f"$KV.{self.change_sets_bucket}."
        if not subject.startswith(head):
            raise InvalidSubject(f"subject {subject[:200]!r} is not a change-set record's")
        return _UNPREFIXED._strip(subject[len(head) :], (), ())

    @property
    def dead_letter_malformed(self) -> str:
        """Where requests stored on malformed subjects (no change set to file them under) are dead-lettered."""
        return self._subject("dlq", "rebaser", "requests", "malformed")

    def api(self, operation: str, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
        """Subject of a request/reply query (``get``, ``fork``) about one change set."""
        return self._subject("rebaser", "api", operation, str(workspace_id), str(change_set_id))

    @property
    def gate_all(self) -> str:
        """Requests of callers in accounts of their own, which their accounts import from the daemons' account under
        ``rebaser.gate.``: a daemon checks the workspace's limit and passes them on (rebaser_server.queries.gate)."""
        return self._subject("rebaser", "gate", "requests", ">")

    def ungated(self, subject: str) -> str:
        """The request subject a gated one (``[P.]rebaser.gate.requests.…``) stands for: ``gate.`` left out."""
        head = f"{self.prefix}.rebaser.gate." if self.prefix else "rebaser.gate."
        if not subject.startswith(head):
            raise InvalidSubject(f"subject {subject[:200]!r} is not a gated request")
        return subject[: len(head) - len("gate.")] + subject[len(head) :]

    def follow_api(self, workspace_id: WorkspacePk) -> str:
        """The JetStream API prefix through which a follower of ``workspace_id`` creates its events consumer: the
        daemons create it for it (``rebaser_server.queries.follow``), so a caller needs no JetStream API of its own
        (docs/events.md, "Permissions")."""
        return self._subject("rebaser", "api", "follow", str(workspace_id))

    @property
    def api_all(self) -> str:
        return self._subject("rebaser", "api", ">")

    @staticmethod
    def change_set_key(workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
        """Key of the change set's record in the change-sets KV bucket."""
        return f"{workspace_id}.{change_set_id}"


_UNPREFIXED = Subjects()  # a record's key has no prefix: parsed as this deployment's
