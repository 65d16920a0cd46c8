"""Typed ULID ids: ``WorkspacePk``, ``ChangeSetId`` and ``RequestId``.

Each is a distinct type (a ``ChangeSetId`` is never accepted where a ``WorkspacePk`` is expected), is
created fresh with ``new()``, parsed with ``parse()`` (which raises :class:`~rebaser_core.errors.InvalidId`),
and prints as the canonical 26-character Crockford base32 ULID. That text alphabet contains no ``.``,
``*``, ``>`` or whitespace, so a valid id is always a safe NATS subject token.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema
from ulid import ULID

from rebaser_core.errors import InvalidId

__all__ = ["ChangeSetId", "RequestId", "UlidId", "WorkspacePk"]


class UlidId:
    """Base of the typed ids. Immutable, hashable, ordered by creation time."""

    __slots__ = ("_ulid",)
    _ulid: ULID

    def __init__(self, value: ULID | str | Self) -> None:
        if isinstance(value, UlidId):
            if type(value) is not type(self):
                raise InvalidId(f"a {type(value).__name__} is not a {type(self).__name__}")
            ulid = value._ulid
        elif isinstance(value, ULID):
            ulid = value
        elif isinstance(value, str):
            ulid = _parse_ulid(type(self).__name__, value)
        else:
            raise InvalidId(f"{type(self).__name__} must be a ULID string, got {type(value).__name__}")
        object.__setattr__(self, "_ulid", ulid)

    @classmethod
    def new(cls) -> Self:
        return cls(ULID())

    @classmethod
    def parse(cls, value: str) -> Self:
        return cls(value)

    @property
    def ulid(self) -> ULID:
        return self._ulid

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __str__(self) -> str:
        return str(self._ulid)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self._ulid)!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._ulid == self._ulid

    def __lt__(self, other: Self) -> bool:
        return self._ulid < other._ulid

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._ulid))

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        def validate(value: Any) -> UlidId:
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


def _parse_ulid(kind: str, value: str) -> ULID:
    # python-ulid accepts lower case too; we normalise to its canonical upper-case text.
    if len(value) != 26:
        raise InvalidId(f"{kind} must be a 26-character ULID, got {value!r}")
    try:
        return ULID.from_str(value.upper())
    except ValueError as err:
        raise InvalidId(f"{kind} is not a valid ULID: {value!r} ({err})") from None


class WorkspacePk(UlidId):
    """Identifies a workspace."""

    __slots__ = ()


class ChangeSetId(UlidId):
    """Identifies a change set within a workspace."""

    __slots__ = ()


class RequestId(UlidId):
    """Identifies one request; also its ``Nats-Msg-Id`` dedupe key and its idempotency key."""

    __slots__ = ()
