"""Typed ULID ids: ``WorkspacePk``, ``ChangeSetId`` and ``RequestId``.

Each is a distinct type (a ``ChangeSetId`` is never accepted where a ``WorkspacePk`` is expected), is
created fresh with ``new()``, parsed with ``parse()`` (which raises :class:`~rebaser_core.errors.InvalidId`),
and prints as the canonical 26-character Crockford base32 ULID. That text alphabet contains no ``.``,
``*``, ``>`` or whitespace, so a valid id is always a safe NATS subject token.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import TYPE_CHECKING, Any, Self

from rebaser_core.errors import InvalidId

if TYPE_CHECKING:
    # Imported where used: the command lines (``rebaser --help``, parsing an id) must not pay for pydantic or
    # python-ulid (tests/unit/client/test_cli_import.py).
    from pydantic import GetCoreSchemaHandler
    from pydantic_core import core_schema
    from ulid import ULID

__all__ = [
    "ChangeSetId",
    "RequestId",
    "UlidId",
    "WorkspacePk",
    "new_ulid_text",
    "new_unordered_ulid_text",
    "ulid_milliseconds",
]


class UlidId:
    """Base of the typed ids. Immutable, hashable, ordered by creation time.

    Held as the canonical text: ids travel as text (subjects, headers, bodies) several times per request, and a
    fixed-width Crockford base32 text sorts exactly like the 128-bit value. The :class:`ULID` object is only
    built when asked for.
    """

    __slots__ = ("text",)
    # The canonical text (26 characters, upper case): what ``str()`` gives, read without a call where it counts.
    text: str

    def __init__(self, value: ULID | str | Self) -> None:
        if isinstance(value, UlidId):
            if type(value) is not type(self):
                raise InvalidId(f"a {type(value).__name__} is not a {type(self).__name__}")
            text = value.text
        elif isinstance(value, str):
            text = _canonical_text(type(self).__name__, value)
        elif _is_ulid(value):
            text = str(value)
        else:
            raise InvalidId(f"{type(self).__name__} must be a ULID string, got {type(value).__name__}")
        object.__setattr__(self, "text", text)

    @classmethod
    def new(cls) -> Self:
        made = cls.__new__(cls)
        object.__setattr__(made, "text", _new_text())
        return made

    @classmethod
    def parse(cls, value: str) -> Self:
        return cls(value)

    @property
    def ulid(self) -> ULID:
        from ulid import ULID

        return ULID.from_str(self.text)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.text == self.text

    def __lt__(self, other: Self) -> bool:
        return self.text < other.text

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.text))

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        from pydantic_core import core_schema

        def validate(value: Any) -> UlidId:
            # The text of an id as we send it (canonical: upper case), on every decoded message: no detour through
            # __init__'s type dispatch and upper-casing.
            if type(value) is str and _ULID_TEXT.fullmatch(value):
                made = cls.__new__(cls)
                object.__setattr__(made, "text", value)
                return made
            if isinstance(value, cls):
                return value
            if not isinstance(value, str):
                raise ValueError(f"{cls.__name__} must be a ULID string")
            try:
                return cls(value)
            except InvalidId as err:
                # pydantic turns ValueError into a ValidationError with the field's location.
                raise ValueError(str(err)) from None

        return core_schema.no_info_plain_validator_function(
            validate,
            json_schema_input_schema=core_schema.str_schema(min_length=26, max_length=26),
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )


def _is_ulid(value: object) -> bool:
    """A python-ulid ULID (its module is imported only if someone made one already)."""
    module = sys.modules.get("ulid")
    return module is not None and isinstance(value, module.ULID)


# Crockford base32 without I, L, O, U; the first character is at most 7 so the value fits in 128 bits.
_ULID_TEXT = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")


# A fresh ULID's text, made here rather than by python-ulid's ULID(): a client makes one per request, and that
# generator (objects, a monotonic policy, a pure-Python encoder) is about 5% of a client's CPU. Same layout: 48 bits
# of Unix milliseconds, 80 random bits; within one millisecond the random part counts up (monotonic, like
# python-ulid's). Encoded ten bits (two characters) at a time from a table: the time's ten characters once per
# millisecond, the random part's sixteen for each id (base64's b32encode, a Python loop in 3.11, takes three times
# as long).
_CROCKFORD_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = tuple(a + b for a in _CROCKFORD_ALPHABET for b in _CROCKFORD_ALPHABET)
_RANDOM_MAX = (1 << 80) - 1
_last = [0, 0]  # [milliseconds, random part] of the last id made in this process
_time_ms = [-1]  # the millisecond whose text _time_text holds
_time_text = [""]
# new_unordered_ulid_text's: the millisecond whose time characters _stamp_time holds, and the first six characters'.
_stamp_ms = [-1]
_stamp_time = [""]
_stamp_high = [-1]
_stamp_high_text = [""]
# A random byte -> a Crockford character, from its five low bits (a byte's 256 values cover each 32 equally).
_RANDOM_CHARACTERS = bytes(ord(_CROCKFORD_ALPHABET[b & 31]) for b in range(256))
_random_pool = [""]  # random Crockford characters not used yet, from _random_at on
_random_at = [0]
# A forked child draws its own (the parent's pool would give both the same ids).
os.register_at_fork(after_in_child=lambda: (_random_pool.__setitem__(0, ""), _random_at.__setitem__(0, 0)))


def _encode_time(ms: int) -> str:
    p = _PAIRS
    return (
        p[(ms >> 40) & 1023]
        + p[(ms >> 30) & 1023]
        + p[(ms >> 20) & 1023]
        + p[(ms >> 10) & 1023]
        + p[ms & 1023]
    )


def _encode_random(r: int) -> str:
    p = _PAIRS
    return (
        p[r >> 70]
        + p[(r >> 60) & 1023]
        + p[(r >> 50) & 1023]
        + p[(r >> 40) & 1023]
        + p[(r >> 30) & 1023]
        + p[(r >> 20) & 1023]
        + p[(r >> 10) & 1023]
        + p[r & 1023]
    )


def _new_text() -> str:
    ms = time.time_ns() // 1_000_000
    last_ms, last_random = _last
    if ms <= last_ms and last_random < _RANDOM_MAX:
        ms, randomness = last_ms, last_random + 1
    else:
        ms, randomness = max(ms, last_ms + (ms <= last_ms)), int.from_bytes(os.urandom(10), "big")
    _last[0], _last[1] = ms, randomness
    if _time_ms[0] != ms:
        _time_ms[0], _time_text[0] = ms, _encode_time(ms)
    return _time_text[0] + _encode_random(randomness)


def new_ulid_text() -> str:
    """A new ULID's canonical text, without an id object around it (monotonic within a millisecond, as ``new``)."""
    return _new_text()


def new_unordered_ulid_text() -> str:
    """A new ULID's text, made for every event the daemon decides, so made cheaply: the time's characters once per
    millisecond (the first six once per 2^20 ms), the random part as sixteen random characters (``os.urandom``
    through a table, 64 ids' worth at a time, not big-integer arithmetic), and not monotonic within a millisecond
    (an event is ordered by its ``seq``; 80 random bits keep its id unique). Its millisecond is the event's time
    (:func:`ulid_milliseconds`)."""
    ms = time.time_ns() // 1_000_000
    if _stamp_ms[0] != ms:
        if _stamp_high[0] != ms >> 20:
            _stamp_high[0], _stamp_high_text[0] = ms >> 20, _encode_time(ms)[:6]
        _stamp_ms[0] = ms
        _stamp_time[0] = _stamp_high_text[0] + _PAIRS[(ms >> 10) & 1023] + _PAIRS[ms & 1023]
    at = _random_at[0]
    if at == len(_random_pool[0]):
        _random_pool[0], at = os.urandom(1024).translate(_RANDOM_CHARACTERS).decode(), 0
    _random_at[0] = at + 16
    return _stamp_time[0] + _random_pool[0][at : at + 16]


_CROCKFORD_VALUE = {c: i for i, c in enumerate(_CROCKFORD_ALPHABET)}


def ulid_milliseconds(text: str) -> int:
    """The Unix millisecond a ULID's canonical text begins with (its first ten characters)."""
    ms = 0
    for character in text[:10]:
        ms = ms * 32 + _CROCKFORD_VALUE[character]
    return ms


def _canonical_text(kind: str, value: str) -> str:
    # Lower case is accepted and normalised to the canonical upper-case text.
    if len(value) != 26:
        raise InvalidId(f"{kind} must be a 26-character ULID, got {value!r}")
    text = value.upper()
    if not _ULID_TEXT.fullmatch(text):
        raise InvalidId(f"{kind} is not a valid ULID (Crockford base32, at most 7ZZZ...): {value!r}")
    return text


class WorkspacePk(UlidId):
    """Identifies a workspace."""

    __slots__ = ()


class ChangeSetId(UlidId):
    """Identifies a change set within a workspace."""

    __slots__ = ()


class RequestId(UlidId):
    """Identifies one request; also its ``Nats-Msg-Id`` dedupe key and its idempotency key."""

    __slots__ = ()
