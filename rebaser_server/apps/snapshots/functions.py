"""The fixed, safe set of functions a ``set_function`` update may name. No eval, no code from requests.

Each function takes the list of its arguments' current values and returns a JSON value, or raises (the error
becomes the attribute's error value). Python users add more with ``SnapshotApp.register_function``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rebaser_server.apps.snapshots.model import Function

__all__ = ["BUILTIN_FUNCTIONS"]

_INDEX = re.compile(r"-?[0-9]+")


def _numbers(args: list[Any]) -> list[int | float]:
    values = [a for a in args if a is not None]
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"expected numbers, got {value!r}")
    return values


def _identity(args: list[Any]) -> Any:
    if len(args) != 1:
        raise TypeError(f"identity takes 1 argument, got {len(args)}")
    return args[0]


def _concat(args: list[Any]) -> str:
    return "".join("" if a is None else a if isinstance(a, str) else str(a) for a in args)


def _format(args: list[Any]) -> str:
    """``format(template, a, b, ...)``: ``{}`` placeholders are filled in order (no attribute access)."""
    if not args or not isinstance(args[0], str):
        raise TypeError("format needs a template string as its first argument")
    template, values = args[0], ["" if a is None else str(a) for a in args[1:]]
    parts = template.split("{}")
    if len(parts) - 1 != len(values):
        raise ValueError(f"template has {len(parts) - 1} placeholders for {len(values)} values")
    out = [parts[0]]
    for value, part in zip(values, parts[1:], strict=True):
        out += [value, part]
    return "".join(out)


def _sum(args: list[Any]) -> int | float:
    return sum(_numbers(args))


def _min(args: list[Any]) -> int | float | None:
    values = _numbers(args)
    return min(values) if values else None


def _max(args: list[Any]) -> int | float | None:
    values = _numbers(args)
    return max(values) if values else None


def _get(args: list[Any]) -> Any:
    """``get(document, key)``: key is a dotted path of object keys and list indexes (``"spec.ports.0"``)."""
    if len(args) != 2 or not isinstance(args[1], str):
        raise TypeError("get takes a JSON document and a dotted key string")
    value = args[0]
    for token in args[1].split(".") if args[1] else []:
        if isinstance(value, dict):
            value = value.get(token)
        elif isinstance(value, list) and _INDEX.fullmatch(token):
            index = int(token)
            value = value[index] if -len(value) <= index < len(value) else None
        else:
            return None
    return value


def _if(args: list[Any]) -> Any:
    if len(args) != 3:
        raise TypeError("if takes a condition, a then-value and an else-value")
    return args[1] if args[0] else args[2]


def _coalesce(args: list[Any]) -> Any:
    return next((a for a in args if a is not None), None)


def _length(args: list[Any]) -> int:
    if len(args) != 1 or not isinstance(args[0], str | list | dict):
        raise TypeError("length takes one string, list or object")
    return len(args[0])


def _equals(args: list[Any]) -> bool:
    # JSON equality: true is not 1 (Python's == says it is), and 1 is not 1.0.
    return len({json.dumps(a, sort_keys=True) for a in args}) <= 1


def _not(args: list[Any]) -> bool:
    if len(args) != 1:
        raise TypeError("not takes 1 argument")
    return not args[0]


BUILTIN_FUNCTIONS: dict[str, Function] = {
    "identity": _identity,
    "concat": _concat,
    "format": _format,
    "sum": _sum,
    "min": _min,
    "max": _max,
    "get": _get,
    "if": _if,
    "coalesce": _coalesce,
    "length": _length,
    "equals": _equals,
    "not": _not,
}
