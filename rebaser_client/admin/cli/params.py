"""Click parameter types shared by the ``rebaser`` commands."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypeAlias

import click

from rebaser_core.errors import InvalidUrl
from rebaser_core.nats.connect import check_server_url

__all__ = ["NATS_URL", "SECONDS"]

# A week: longer than any wait these commands make sense for, short enough for every timer to handle.
_MAX_SECONDS = 7 * 24 * 3600.0


if TYPE_CHECKING:
    _ParamType: TypeAlias = click.ParamType[float, Any]  # generic since click 8.2
    _StrParamType: TypeAlias = click.ParamType[str, Any]
else:
    _ParamType = _StrParamType = click.ParamType


class _Seconds(_ParamType):
    """A duration in seconds: a finite number, 0 or more (``nan`` and ``inf`` pass click's own FloatRange, and a
    NaN deadline never comes)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or not 0 <= seconds <= _MAX_SECONDS:
            self.fail(f"{value!r} must be a number of seconds from 0 to {_MAX_SECONDS:.0f}", param, ctx)
        return seconds


SECONDS = _Seconds()


class _NatsUrl(_StrParamType):
    """A NATS server URL with a scheme nats-py connects with (nats://, tls://, ws://, wss://; none means nats://):
    ``http://...`` is refused here, naming the schemes, rather than failing later as a name lookup of ``http``."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return check_server_url(str(value))
        except InvalidUrl as err:
            self.fail(str(err), param, ctx)


NATS_URL = _NatsUrl()
