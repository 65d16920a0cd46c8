"""The dependent values update of the built-in app: recompute every function attribute downstream of the roots a
rebase marked, in dependency order, each once.

Pure Python, like :mod:`~rebaser_server.apps.snapshots.model`. Cycles and failing functions become error values on
the attributes involved; they never raise and never loop. Its work is linear in what is downstream, and with
:class:`~rebaser_server.apps.snapshots.limits.Limits` no computed value, and so no snapshot, grows without bound.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from rebaser_server.apps.snapshots.limits import Limits, json_size
from rebaser_server.apps.snapshots.model import Attribute, Function, Snapshot, _canonical

__all__ = ["MAX_ERROR_CHARS", "dependent_values_update"]

# An index into a JSON array, as an argument path token (`/list/0`).
_INDEX = re.compile(r"-?[0-9]+")


def _prefixes(path: str) -> list[str]:
    """``path`` and every attribute path above it, longest first: ``/a/b/c`` -> ``/a/b/c``, ``/a/b``, ``/a``."""
    parts = path.split("/")[1:]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _source(arg: str, attributes: Mapping[str, Attribute]) -> str | None:
    """The attribute an argument path reads: itself, else the nearest attribute above it (the argument then points
    into that attribute's JSON value, e.g. ``/web/config/port`` into ``/web/config``), else None."""
    return next((p for p in _prefixes(arg) if p in attributes), None)


def _resolve(arg: str, attributes: Mapping[str, Attribute]) -> tuple[Attribute | None, Any]:
    """The attribute an argument reads and the argument's value: null when the path leads nowhere."""
    source = _source(arg, attributes)
    if source is None:
        return None, None
    attribute = attributes[source]
    value = attribute.value
    for token in arg[len(source) + 1 :].split("/") if arg != source else []:
        if isinstance(value, dict):
            value = value.get(token)
        elif isinstance(value, list) and _INDEX.fullmatch(token) and -len(value) <= int(token) < len(value):
            value = value[int(token)]
        else:
            return attribute, None
    return attribute, value


def _dependents(attributes: Mapping[str, Attribute]) -> dict[str, set[str]]:
    """Path -> the function attributes to recompute when it changes. An argument depends on its own path and on
    every path above it: setting or removing ``/web/config`` changes what ``/web/config/port`` reads."""
    dependents: dict[str, set[str]] = {}
    for path, attribute in attributes.items():
        for arg in attribute.args:
            for source in _prefixes(arg):
                dependents.setdefault(source, set()).add(path)
    return dependents


def settled_without_update(snapshot: Snapshot) -> Snapshot | None:
    """``snapshot`` with its roots cleared if no function attribute is downstream of them (then a DVU would change
    nothing else: this is its result); None if a DVU has something to compute. Linear in attributes plus
    dependency edges, like the rebase that made the roots."""
    if not snapshot.roots or _downstream(snapshot.attributes, snapshot.roots):
        return None
    return Snapshot(snapshot.attributes, frozenset())


def _downstream(attributes: Mapping[str, Attribute], roots: Iterable[str]) -> set[str]:
    """Every function attribute reachable from the roots (including roots that are functions themselves).

    Each path is pushed at most once, so this is linear in attributes plus dependency edges."""
    dependents = _dependents(attributes)
    seen: set[str] = set(roots)
    stack = list(seen)
    while stack:
        for dependent in dependents.get(stack.pop(), ()):
            if dependent not in seen:
                seen.add(dependent)
                stack.append(dependent)
    return {p for p in seen if p in attributes and attributes[p].is_function}


def dependent_values_update(
    snapshot: Snapshot,
    functions: Mapping[str, Function],
    limits: Limits | None = None,
    *,
    encoded_size: int | None = None,
) -> tuple[Snapshot, list[str]]:
    """Recompute everything downstream of the roots, each once, in dependency order.

    Returns the new snapshot (no roots left) and the order in which attributes were computed. Linear in the
    affected attributes and their dependency edges (plus sorting, for a deterministic order): a hostile chain of
    50,000 functions must not cost 50,000² steps. With ``limits``, a function whose inputs or value are too large,
    or whose value would take the snapshot over its size limit, gets an error value instead (unbounded, eleven
    ``concat`` doublings of a 100 KB literal make a 391 MB snapshot). ``encoded_size``: ``len(snapshot.encode())``, if
    the caller knows it (else it is measured).
    """
    attributes = dict(snapshot.attributes)
    sizes = None if limits is None else _Sizes(snapshot, limits, encoded_size)
    affected = _downstream(attributes, snapshot.roots)
    # Kahn's algorithm over the affected subgraph: an attribute is ready once none of its args is still pending.
    pending_args = {p: _affected_sources(attributes[p], attributes, affected) for p in affected}
    dependents: dict[str, set[str]] = {}
    for path, sources in pending_args.items():
        for source in sources:
            dependents.setdefault(source, set()).add(path)
    ready = deque(sorted(p for p, args in pending_args.items() if not args))
    order: list[str] = []
    while ready:
        path = ready.popleft()
        order.append(path)
        computed = _compute(attributes[path], attributes, functions, sizes)
        attributes[path] = computed if sizes is None else sizes.admit(path, attributes, computed)
        for dependent in sorted(dependents.get(path, ())):
            waiting = pending_args[dependent]
            # Each (input, dependent) edge is visited once, so a dependent empties its set (and is queued) once.
            if path in waiting:
                waiting.discard(path)
                if not waiting:
                    ready.append(dependent)
    # Whatever never became ready is on a cycle or downstream of one.
    for path in sorted(affected - set(order)):
        cycle = _failed(attributes[path], f"dependency cycle through {path}")
        attributes[path] = cycle if sizes is None else sizes.admit(path, attributes, cycle)
    return Snapshot(attributes, frozenset()), order


class _Sizes:
    """Encoded value sizes (each measured once per run) and the bytes the snapshot may still grow by."""

    def __init__(self, snapshot: Snapshot, limits: Limits, encoded_size: int | None) -> None:
        self.limits = limits
        self._known: dict[str, int] = {}
        size = len(snapshot.encode()) if encoded_size is None else encoded_size
        self._room = limits.max_snapshot_bytes - size

    def of(self, path: str, attributes: Mapping[str, Attribute]) -> int:
        size = self._known.get(path)
        if size is None:
            attribute = attributes.get(path)
            size = self._known[path] = 4 if attribute is None else json_size(attribute.value)
        return size

    def admit(self, path: str, attributes: dict[str, Attribute], new: Attribute) -> Attribute:
        """``new`` if the snapshot has room for it, else a (short) error value; the room is updated."""
        old_weight = self.of(path, attributes) + len(attributes[path].error or "")
        new_size = json_size(new.value)
        growth = new_size + len(new.error or "") - old_weight
        if growth > 0 and growth > self._room:
            new = _failed(new, "over max_snapshot_bytes")
            new_size = 4
            growth = new_size + len(new.error or "") - old_weight
        self._room -= growth
        self._known[path] = new_size
        return new


def _failed(attribute: Attribute, error: str) -> Attribute:
    return Attribute(value=None, function=attribute.function, args=attribute.args, error=_short(error))


def _affected_sources(
    attribute: Attribute, attributes: Mapping[str, Attribute], affected: set[str]
) -> set[str]:
    """The attributes among ``affected`` that ``attribute``'s arguments read (to compute it after them)."""
    return {s for a in attribute.args if (s := _source(a, attributes)) is not None and s in affected}


def _compute(
    attribute: Attribute,
    attributes: Mapping[str, Attribute],
    functions: Mapping[str, Function],
    sizes: _Sizes | None = None,
) -> Attribute:
    assert attribute.function is not None
    function = functions.get(attribute.function)
    if function is None:
        return _failed(attribute, f"unknown function {attribute.function!r}")
    args = []
    for arg in attribute.args:
        source, value = _resolve(arg, attributes)
        if source is not None and source.error is not None:
            # Name the input and the root cause, not the whole chain of inputs in between.
            cause = source.error.split(": ", 1)[-1] if source.error.startswith("input /") else source.error
            return _failed(attribute, f"input {arg} has an error: {cause}")
        args.append(value)
    if sizes is not None:
        inputs = sum(sizes.of(arg, attributes) for arg in attribute.args)
        if inputs > sizes.limits.max_function_input_bytes:
            limit = sizes.limits.max_function_input_bytes
            return _failed(
                attribute, f"inputs of {inputs} bytes are over the limit of {limit} (4 times max_value_bytes)"
            )
    try:
        encoded = _canonical(function(args))
    except Exception as err:
        return _failed(attribute, f"{attribute.function} failed: {type(err).__name__}: {err}")
    if sizes is not None and len(encoded) > sizes.limits.max_value_bytes:
        limit = sizes.limits.max_value_bytes
        return _failed(
            attribute, f"value of {len(encoded)} bytes is over the limit of {limit} (max_value_bytes)"
        )
    # Store exactly the JSON form: it is what the snapshot encodes, so a reloaded snapshot is equal.
    return Attribute(value=json.loads(encoded), function=attribute.function, args=attribute.args)


MAX_ERROR_CHARS = 256
"""Error values are cut to this length: an error quotes its input's error, so along a chain of 50,000 failing
functions uncut messages would grow quadratically; and a function's exception may quote a huge argument."""


def _short(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"
