"""Snapshots of a change set's attributes, the rebase of an update batch, and the dependent values update.

Pure Python: no NATS, no I/O, so every rule here is unit-tested on its own.

- A :class:`Snapshot` maps attribute paths to :class:`Attribute` s. An attribute is a literal (any JSON value) or a
  function of other attributes' values. Every attribute has a ``version`` (a short content hash) that changes when
  the attribute changes, and a snapshot is identified by its ``address`` (the hash of its canonical encoding).
- :func:`rebase` applies a batch of updates atomically: if any update names an ``expected_version`` its target no
  longer has, the batch is refused with the list of conflicts and nothing is applied.
- :func:`changes_since` + :func:`apply_changes` carry everything one change set changed since its fork onto another,
  with the same conflict rule (the target must still have, for each changed path, the version seen at the fork).
- Applying marks *dependent-value roots*; ``dvu.dependent_values_update`` recomputes every function attribute
  downstream of the roots, in dependency order, each once. Cycles and failing functions become error values on the
  attributes involved; they never raise and never loop. Its work is linear in what is downstream, and with
  :class:`~rebaser_server.apps.snapshots.limits.Limits` no computed value, and so no snapshot, grows without bound.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rebaser_core.api import Conflict, Remove, SetFunction, SetLiteral, Update
from rebaser_server.apps.snapshots.canonical import canonical, canonical_str

__all__ = [
    "Attribute",
    "Change",
    "Function",
    "Rebased",
    "Snapshot",
    "apply_changes",
    "changes_since",
    "rebase",
]

Function = Callable[[list[Any]], Any]


_canonical = canonical  # the form every encoding and hash here uses (rebaser_server.apps.snapshots.canonical)


def _hash(data: Any, length: int = 64) -> str:
    return hashlib.sha256(_canonical(data)).hexdigest()[:length]


@dataclass(frozen=True, slots=True)
class Attribute:
    """A literal (``function`` is None) or a function of ``args``; ``value`` is its (computed) value."""

    value: Any = None
    function: str | None = None
    args: tuple[str, ...] = ()
    error: str | None = None  # set when computing the value failed (cycle, bad input, unknown function)
    stale: bool = False  # a function whose value awaits the next dependent values update
    # Its canonical JSON text, made the first time it is needed (json_text). A snapshot is encoded whole on every
    # request that changes it, and most of its attributes are the same objects as in the snapshot before: with the
    # text kept, only the changed ones are encoded again. Immutable, so it never goes stale; not part of the value
    # (equality and hashing ignore it), and ``replace`` makes a new one.
    _json: str | None = field(default=None, init=False, compare=False, repr=False)

    @property
    def is_function(self) -> bool:
        return self.function is not None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"value": self.value}
        if self.function is not None:
            data["function"] = self.function
            data["args"] = list(self.args)
        if self.error is not None:
            data["error"] = self.error
        if self.stale:
            data["stale"] = True
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attribute:
        return cls(
            value=data.get("value"),
            function=data.get("function"),
            args=tuple(data.get("args", ())),
            error=data.get("error"),
            stale=bool(data.get("stale", False)),
        )

    def json_text(self) -> str:
        """``_canonical(self.to_json()).decode()``, kept once made (see ``_json``)."""
        text = self._json
        if text is None:
            text = _canonical(self.to_json()).decode()
            # A frozen dataclass: set the way its __init__ does. Two threads racing here store equal texts.
            object.__setattr__(self, "_json", text)
        return text

    @property
    def version(self) -> str:
        """Changes exactly when the attribute (definition, value or error) changes."""
        return hashlib.sha256(self.json_text().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Snapshot:
    """An immutable map of paths to attributes, with the dependent-value roots still to recompute."""

    attributes: Mapping[str, Attribute] = field(default_factory=dict)
    roots: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {
            "attributes": {p: a.to_json() for p, a in sorted(self.attributes.items())},
            "roots": sorted(self.roots),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Snapshot:
        return cls(
            {p: Attribute.from_json(a) for p, a in data.get("attributes", {}).items()},
            frozenset(data.get("roots", ())),
        )

    def encode(self) -> bytes:
        """The canonical JSON form, ``_canonical(self.to_json())`` byte for byte, but built one attribute at a time
        from each attribute's kept text (``Attribute.json_text``): one ``json.dumps`` of a whole large snapshot
        would hold the GIL, and so stall the event loop even from a worker thread, and would encode again every
        attribute the request did not change."""
        attributes = ",".join(
            f"{canonical_str(path)}:{attribute.json_text()}"
            for path, attribute in sorted(self.attributes.items())
        )
        return f'{{"attributes":{{{attributes}}},"roots":{_canonical(sorted(self.roots)).decode()}}}'.encode()

    @classmethod
    def decode(cls, data: bytes) -> Snapshot:
        return cls.from_json(json.loads(data))

    @property
    def address(self) -> str:
        """Content address: equal snapshots have equal addresses."""
        return self.address_of(self.encode())

    @staticmethod
    def address_of(encoded: bytes) -> str:
        return hashlib.sha256(encoded).hexdigest()

    def version(self, path: str) -> str | None:
        attribute = self.attributes.get(path)
        return None if attribute is None else attribute.version

    def values(self) -> dict[str, Any]:
        return {p: a.value for p, a in self.attributes.items()}

    def errors(self) -> dict[str, str]:
        return {p: a.error for p, a in self.attributes.items() if a.error is not None}


@dataclass(frozen=True, slots=True)
class Rebased:
    """The outcome of a rebase: the new snapshot, or the conflicts (and the unchanged snapshot)."""

    snapshot: Snapshot
    conflicts: tuple[Conflict, ...] = ()
    performed: int = 0

    @property
    def ok(self) -> bool:
        return not self.conflicts


# -- rebase ------------------------------------------------------------------------------------------------


def _conflicts(
    snapshot: Snapshot, expectations: Iterable[tuple[str, str | None, bool]]
) -> tuple[Conflict, ...]:
    """``expectations``: (path, expected version, whether an expectation was given at all)."""
    found = []
    for path, expected, given in expectations:
        if not given:
            continue  # no version to compare: its own is a hash, not worth computing for nothing
        actual = snapshot.version(path)
        if expected != actual:
            found.append(
                Conflict(
                    path=path,
                    expected_version=expected,
                    actual_version=actual,
                    message="the target changed since the update was computed",
                )
            )
    return tuple(found)


def rebase(snapshot: Snapshot, updates: Sequence[Update]) -> Rebased:
    """Apply ``updates`` atomically onto ``snapshot``; refuse all of them if any conflicts."""
    conflicts = _conflicts(
        snapshot, ((u.path, u.expected_version, u.expected_version is not None) for u in updates)
    )
    if conflicts:
        return Rebased(snapshot, conflicts)
    attributes = dict(snapshot.attributes)
    roots = set(snapshot.roots)
    for update in updates:
        if isinstance(update, SetLiteral):
            attributes[update.path] = Attribute(value=update.value)
        elif isinstance(update, SetFunction):
            previous = attributes.get(update.path)
            attributes[update.path] = Attribute(
                value=None if previous is None else previous.value,
                function=update.function,
                args=tuple(update.args),
                stale=True,
            )
        elif isinstance(update, Remove):
            attributes.pop(update.path, None)
        roots.add(update.path)
    return Rebased(Snapshot(attributes, frozenset(roots)), performed=len(updates))


# -- applying one change set onto another -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    """One path changed by a change set since its fork: the new attribute, or None for a removal.

    ``base_version`` is the path's version at the fork (None: absent), reported in conflicts; ``base_definition``
    is what decides them: definitions, not computed values, because a target that merely recomputed a function
    has not changed it.
    """

    path: str
    base_version: str | None
    attribute: Attribute | None
    base_definition: str | None = None


def changes_since(base: Snapshot, current: Snapshot) -> list[Change]:
    """What ``current`` changed relative to ``base`` (its fork point). Computed values are not changes of their own:
    a function's definition is what travels; the target recomputes it."""
    changes = []
    for path in sorted(set(base.attributes) | set(current.attributes)):
        before, after = base.attributes.get(path), current.attributes.get(path)
        if _definition(before) != _definition(after):
            changes.append(Change(path, base.version(path), after, _definition(before)))
    return changes


def _definition(attribute: Attribute | None) -> str | None:
    """A version of what was *set* (literal value, or function and args), ignoring computed state."""
    if attribute is None:
        return None
    if attribute.is_function:
        return _hash(["function", attribute.function, list(attribute.args)], 16)
    return _hash(["literal", attribute.value], 16)


def apply_changes(target: Snapshot, changes: Sequence[Change]) -> Rebased:
    """Apply changes made elsewhere; a path the target also changed since the fork is a conflict."""
    conflicts = tuple(
        Conflict(
            path=c.path,
            expected_version=c.base_version,
            actual_version=target.version(c.path),
            message="changed on both sides since the fork",
        )
        for c in changes
        if _definition(target.attributes.get(c.path)) != c.base_definition
    )
    if conflicts:
        return Rebased(target, conflicts)
    attributes = dict(target.attributes)
    roots = set(target.roots)
    for change in changes:
        if change.attribute is None:
            attributes.pop(change.path, None)
        elif change.attribute.is_function:
            previous = attributes.get(change.path)  # the definition travels; the value is recomputed here
            attributes[change.path] = Attribute(
                value=None if previous is None else previous.value,
                function=change.attribute.function,
                args=change.attribute.args,
                stale=True,
            )
        else:
            attributes[change.path] = Attribute(value=change.attribute.value)
        roots.add(change.path)
    return Rebased(Snapshot(attributes, frozenset(roots)), performed=len(changes))
