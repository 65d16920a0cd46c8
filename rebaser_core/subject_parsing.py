"""Reading a subject back: the change set a request, task, event or query subject names (:class:`ParsedSubject`),
the shard of a request or task subject, the workspace of a follower's API request.

:class:`SubjectParsing` is the base of :class:`~rebaser_core.subjects.Subjects`, which names them (the subjects'
forms are in rebaser_core.subjects); a record write's subject is read there, from the change-sets bucket's name.
An id token must be a canonical (upper-case) ULID; a subject not of the form raises
:class:`~rebaser_core.errors.InvalidSubject`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rebaser_core.errors import InvalidSubject
from rebaser_core.ids import ChangeSetId, WorkspacePk

__all__ = ["ParsedSubject", "SubjectParsing"]


@dataclass(frozen=True, slots=True)
class ParsedSubject:
    workspace_id: WorkspacePk
    change_set_id: ChangeSetId


class SubjectParsing:
    """The parsing half of :class:`~rebaser_core.subjects.Subjects`, its base: the subjects of one deployment (its
    prefix) and shard, read back."""

    # Subjects is a slotted dataclass: a base without slots of its own would give every instance a __dict__.
    __slots__ = ()

    # What Subjects is made of (rebaser_core.subjects), and its names of another shard.
    prefix: str | None
    shard: int
    for_shard: Callable[[int], SubjectParsing]

    # -- a change set's subjects ---------------------------------------------------------------------
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

    def _head(self, kind: str) -> tuple[str, ...]:
        return ("rebaser", kind, str(self.shard)) if self.shard else ("rebaser", kind)

    def parse_task(self, subject: str) -> ParsedSubject:
        """The change set of a task subject, as published (``….process``) or as stored in a lane (``….<lane>``)."""
        if subject.endswith(".process"):
            return self._strip(subject, self._head("tasks"), ("process",))
        head, _, lane = subject.rpartition(".")
        if not (lane.isdecimal() and len(lane) <= 4):
            raise InvalidSubject(f"subject {subject!r} is not a task subject")
        return self._strip(head, self._head("tasks"), ())

    def is_lane_task(self, subject: str) -> bool:
        """Whether a stored task subject is in the lanes' form (``….<lane>``)."""
        return not subject.endswith(".process")

    def parse_requests(self, subject: str) -> ParsedSubject:
        return self._strip(subject, self._head("requests"), ())

    def shard_of_subject(self, subject: str) -> int:
        """The shard a request or task subject belongs to (0 unless it carries a numeric shard token)."""
        tokens = subject.split(".")
        if self.prefix:
            tokens = tokens[1:]
        shard = tokens[2] if len(tokens) in (5, 6) and tokens[0] == "rebaser" else ""
        # A shard token is a short decimal number; a workspace id (26 characters) never is.
        if 0 < len(shard) <= 4 and shard.isdigit() and shard[0] != "0":
            return int(shard)
        return 0

    def parse_any_requests(self, subject: str) -> ParsedSubject:
        """Parse a request subject of any shard of this deployment."""
        return self.for_shard(self.shard_of_subject(subject)).parse_requests(subject)

    def parse_events(self, subject: str) -> ParsedSubject:
        return self._strip(subject, ("rebaser", "events"), ())

    def parse_api(self, subject: str, operation: str) -> ParsedSubject:
        return self._strip(subject, ("rebaser", "api", operation), ())

    # -- a follower's API requests ---------------------------------------------------------------------
    def parse_follow_api(self, subject: str) -> tuple[WorkspacePk, list[str]]:
        """The workspace of a follower's API request and the JetStream API tokens after it
        (``CONSUMER.CREATE.<stream>.<name>.<filter>``)."""
        tokens = subject.split(".")
        head = [self.prefix] if self.prefix else []
        head += ["rebaser", "api", "follow"]
        if tokens[: len(head)] != head or len(tokens) <= len(head) + 1:
            raise InvalidSubject(f"subject {subject[:200]!r} is not a follower's API request")
        token = tokens[len(head)]
        try:
            workspace_id = WorkspacePk(token)
        except ValueError as err:
            raise InvalidSubject(f"subject {subject[:200]!r}: {err}") from None
        if str(workspace_id) != token:
            raise InvalidSubject(
                f"subject {subject[:200]!r}: ids in subjects must be canonical upper-case ULIDs"
            )
        return workspace_id, tokens[len(head) + 1 :]

    def is_follow_api(self, subject: str) -> bool:
        head = f"{self.prefix}.rebaser.api.follow." if self.prefix else "rebaser.api.follow."
        return subject.startswith(head)
