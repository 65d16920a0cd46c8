"""The limits of the built-in app, so that no request makes a daemon compute or hold without bound.

Pure: the app builds :class:`Limits` from :class:`~rebaser_core.settings.Settings` (documented in
``docs/protocol.md``, "Limits"). A request over a limit is refused with :class:`OverLimit` (an
``UnprocessableError``: error reply and dead letter); the dependent values update never refuses, it turns a
computed value that would break a limit into an error value instead (see ``model.dependent_values_update``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rebaser_core.api import SetLiteral, Update
from rebaser_core.errors import UnprocessableError
from rebaser_core.settings import Settings
from rebaser_server.apps.snapshots.canonical import compact

__all__ = ["MAX_VERSION_CHARS", "Limits", "OverLimit", "check_growth", "check_updates", "json_size"]

MAX_VERSION_CHARS = 256
"""An ``expected_version`` longer than this cannot be one of ours; it would only inflate the conflicts reply."""

_DEFAULTS = Settings()


@dataclass(frozen=True, slots=True)
class Limits:
    max_updates: int = _DEFAULTS.max_updates_per_request
    max_value_bytes: int = _DEFAULTS.max_value_bytes
    max_snapshot_bytes: int = _DEFAULTS.max_snapshot_bytes
    max_attributes: int = _DEFAULTS.max_snapshot_attributes
    # Not a limit on requests: the largest snapshot kept in the change set's record rather than the object store.
    inline_bytes: int = _DEFAULTS.snapshot_inline_bytes

    @property
    def max_function_input_bytes(self) -> int:
        """A function is not called on more input than this: ``concat`` of many large values would be huge."""
        return 4 * self.max_value_bytes

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            max_updates=settings.max_updates_per_request,
            max_value_bytes=settings.max_value_bytes,
            max_snapshot_bytes=settings.max_snapshot_bytes,
            max_attributes=settings.max_snapshot_attributes,
            inline_bytes=settings.snapshot_inline_bytes,
        )


class OverLimit(UnprocessableError):
    """A request over one of the app's limits: refused as a whole, nothing applied."""

    def __init__(self, what: str, size: int, maximum: int, setting: str) -> None:
        super().__init__(f"{what}: {size} is over the limit of {maximum} ({setting})")
        self.size = size
        self.maximum = maximum
        self.setting = setting


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON, the form a snapshot stores."""
    return len(compact(value))


def check_updates(updates: Sequence[Update], limits: Limits) -> None:
    """Refuse a batch with too many updates, an oversized literal, or an implausible expected version."""
    if len(updates) > limits.max_updates:
        raise OverLimit("updates in the request", len(updates), limits.max_updates, "max_updates_per_request")
    for update in updates:
        version = update.expected_version
        if version is not None and len(version) > MAX_VERSION_CHARS:
            raise OverLimit(
                f"expected_version of {update.path} (characters)", len(version), MAX_VERSION_CHARS, "fixed"
            )
        if isinstance(update, SetLiteral):
            size = json_size(update.value)
            if size > limits.max_value_bytes:
                raise OverLimit(
                    f"value of {update.path} (bytes)", size, limits.max_value_bytes, "max_value_bytes"
                )


def check_growth(before: tuple[int, int], after: tuple[int, int], limits: Limits) -> None:
    """Refuse a result over the snapshot limits, (attributes, bytes), unless it shrinks what was already over
    (after the limits were lowered, removing attributes must still work)."""
    (count_before, bytes_before), (count_after, bytes_after) = before, after
    if count_after > limits.max_attributes and count_after > count_before:
        raise OverLimit(
            "attributes in the snapshot", count_after, limits.max_attributes, "max_snapshot_attributes"
        )
    if bytes_after > limits.max_snapshot_bytes and bytes_after > bytes_before:
        raise OverLimit("snapshot bytes", bytes_after, limits.max_snapshot_bytes, "max_snapshot_bytes")
