"""The updates a request carries: set a literal, set a function of other attributes, or remove.

Attributes are addressed by path (``/components/web/port``). An update may name the version of its target it was
computed against (``expected_version``); if the target changed since, the whole batch is refused as a conflict.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

__all__ = [
    "AttributePath",
    "InlineUpdates",
    "Remove",
    "SetFunction",
    "SetLiteral",
    "StoredUpdates",
    "Update",
    "UpdatesKind",
]

AttributePath = Annotated[str, Field(pattern=r"^(/[^/\s]+)+$", max_length=1024)]
"""``/`` followed by one or more non-empty segments; no whitespace."""


class _Update(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    path: AttributePath
    expected_version: str | None = None


class SetLiteral(_Update):
    op: Literal["set"] = "set"
    value: JsonValue


class SetFunction(_Update):
    op: Literal["set_function"] = "set_function"
    function: Annotated[str, Field(min_length=1, max_length=128)]
    args: list[AttributePath] = Field(default_factory=list)


class Remove(_Update):
    op: Literal["remove"] = "remove"


Update = Annotated[SetLiteral | SetFunction | Remove, Field(discriminator="op")]


class InlineUpdates(BaseModel):
    """The batch travels inside the request."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    kind: Literal["inline"] = "inline"
    updates: list[Update]


class StoredUpdates(BaseModel):
    """The batch is stored elsewhere (for example an object store) under a content address."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    kind: Literal["stored"] = "stored"
    address: Annotated[str, Field(min_length=1, max_length=256)]


UpdatesKind = Annotated[InlineUpdates | StoredUpdates, Field(discriminator="kind")]
