"""NATS subjects and stream names, with the optional per-deployment prefix.

With prefix ``P`` every subject gains a leading ``P.`` token and every stream name a leading ``P_``
(docs/design.md §1); tests give each test its own prefix so their streams never collide.

================  =================================================
requests          ``[P.]rebaser.requests.<workspace>.<change_set>``
tasks             ``[P.]rebaser.tasks.<workspace>.<change_set>.process``
dead letters      ``[P.]dlq.rebaser.requests.<workspace>.<change_set>`` (``….malformed`` for junk subjects)
queries           ``[P.]rebaser.api.<get|fork>.<workspace>.<change_set>`` (core NATS request/reply)
================  =================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rebaser_core.errors import InvalidSubject
from rebaser_core.ids import ChangeSetId, WorkspacePk

__all__ = ["ParsedSubject", "Subjects", "validate_prefix"]

# Letters, digits, '-' and '_' are safe in subject tokens *and* in stream, consumer and bucket names.
_PREFIX_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")

REQUESTS_STREAM = "REBASER_REQUESTS"
TASKS_STREAM = "REBASER_TASKS"
DEAD_LETTER_STREAM = "REBASER_DEAD_LETTERS"
CHANGE_SETS_BUCKET = "REBASER_CHANGE_SETS"
SNAPSHOTS_BUCKET = "REBASER_SNAPSHOTS"
BATCHES_BUCKET = "REBASER_BATCHES"
TASKS_CONSUMER = "rebaser-tasks"


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
class ParsedSubject:
    workspace_id: WorkspacePk
    change_set_id: ChangeSetId


@dataclass(frozen=True, slots=True)
class Subjects:
    """All names for one deployment (one prefix). Build with ``Subjects(prefix)``."""

    prefix: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", validate_prefix(self.prefix))

    def _subject(self, *tokens: str) -> str:
        return ".".join((self.prefix, *tokens) if self.prefix else tokens)

    def _name(self, name: str) -> str:
        return f"{self.prefix}_{name}" if self.prefix else name

    # -- stream, consumer and bucket names ------------------------------------------------------
    @property
    def requests_stream(self) -> str:
        return self._name(REQUESTS_STREAM)

    @property
    def tasks_stream(self) -> str:
        return self._name(TASKS_STREAM)

    @property
    def dead_letter_stream(self) -> str:
        return self._name(DEAD_LETTER_STREAM)

    @property
    def change_sets_bucket(self) -> str:
        return self._name(CHANGE_SETS_BUCKET)

    @property
    def snapshots_bucket(self) -> str:
        """Object store of the built-in app's snapshots (content-addressed, written once)."""
        return self._name(SNAPSHOTS_BUCKET)

    @property
    def batches_bucket(self) -> str:
        """Object store of stored update batches (the v3 ``stored`` updates kind), named by content address."""
        return self._name(BATCHES_BUCKET)

    @property
    def tasks_consumer(self) -> str:
        return TASKS_CONSUMER

    # -- stream subject filters -----------------------------------------------------------------
    @property
    def requests_all(self) -> str:
        """Everything under the requests subject space (for listing, including subjects stored by older
        stream configurations that took any number of tokens)."""
        return self._subject("rebaser", "requests", ">")

    @property
    def tasks_all(self) -> str:
        return self._subject("rebaser", "tasks", ">")

    @property
    def requests_stream_subject(self) -> str:
        """What the requests stream stores: exactly two tokens after ``rebaser.requests``, so a request on a
        subject with more or fewer tokens is refused by JetStream instead of stored for good."""
        return self._subject("rebaser", "requests", "*", "*")

    @property
    def tasks_stream_subject(self) -> str:
        """What the tasks stream stores: ``rebaser.tasks.<wk>.<cs>.process`` and nothing else."""
        return self._subject("rebaser", "tasks", "*", "*", "process")

    @property
    def tasks_filter(self) -> str:
        """The shared tasks consumer's filter (exactly the task subjects, nothing else)."""
        return self._subject("rebaser", "tasks", "*", "*", "*")

    @property
    def dead_letters_all(self) -> str:
        return self._subject("dlq", "rebaser", "requests", ">")

    # -- per change set ---------------------------------------------------------------------------
    def requests(self, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
        return self._subject("rebaser", "requests", str(workspace_id), str(change_set_id))

    def task(self, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
        return self._subject("rebaser", "tasks", str(workspace_id), str(change_set_id), "process")

    def dead_letter(self, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
        return self._subject("dlq", "rebaser", "requests", str(workspace_id), str(change_set_id))

    @property
    def dead_letter_malformed(self) -> str:
        """Where requests stored on malformed subjects (no change set to file them under) are dead-lettered."""
        return self._subject("dlq", "rebaser", "requests", "malformed")

    def api(self, operation: str, workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
        """Subject of a request/reply query (``get``, ``fork``) about one change set."""
        return self._subject("rebaser", "api", operation, str(workspace_id), str(change_set_id))

    @property
    def api_all(self) -> str:
        return self._subject("rebaser", "api", ">")

    def parse_api(self, subject: str, operation: str) -> ParsedSubject:
        return self._strip(subject, ("rebaser", "api", operation), ())

    @staticmethod
    def change_set_key(workspace_id: WorkspacePk, change_set_id: ChangeSetId) -> str:
        """Key of the change set's record in the change-sets KV bucket."""
        return f"{workspace_id}.{change_set_id}"

    # -- parsing ------------------------------------------------------------------------------------
    def _strip(self, subject: str, head: tuple[str, ...], tail: tuple[str, ...]) -> ParsedSubject:
        tokens = subject.split(".")
        if self.prefix:
            if not tokens or tokens[0] != self.prefix:
                raise InvalidSubject(f"subject {subject!r} lacks the prefix {self.prefix!r}")
            tokens = tokens[1:]
        n = len(head)
        if len(tokens) != n + 2 + len(tail) or tuple(tokens[:n]) != head or tuple(tokens[n + 2 :]) != tail:
            raise InvalidSubject(
                f"subject {subject!r} is not of the form {'.'.join((*head, '<wk>', '<cs>', *tail))}"
            )
        try:
            parsed = ParsedSubject(WorkspacePk(tokens[n]), ChangeSetId(tokens[n + 1]))
        except ValueError as err:
            raise InvalidSubject(f"subject {subject!r}: {err}") from None
        # Subjects are case-sensitive: a lower-case id token names a different subject than the one consumed.
        if (str(parsed.workspace_id), str(parsed.change_set_id)) != (tokens[n], tokens[n + 1]):
            raise InvalidSubject(f"subject {subject!r}: ids in subjects must be canonical upper-case ULIDs")
        return parsed

    def parse_task(self, subject: str) -> ParsedSubject:
        return self._strip(subject, ("rebaser", "tasks"), ("process",))

    def parse_requests(self, subject: str) -> ParsedSubject:
        return self._strip(subject, ("rebaser", "requests"), ())
