"""The daemon's log lines: for people (``console``) or for a log pipeline (``json``, one object a line).

Lines written while a request is handled carry its ids (``request_id``, ``workspace_id``, ``change_set_id``): the
request path binds them in a context variable (:func:`bind_request`) and a logging filter copies them onto every
record, so no log call anywhere has to pass them.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any, Literal

__all__ = ["LOG_FORMATS", "ContextFilter", "JsonFormatter", "LogFormat", "bind_request", "configure_logging"]

LogFormat = Literal["console", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("console", "json")

_CONTEXT: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "rebaser_log_context", default=None
)
_CONSOLE = "%(asctime)s %(levelname)s %(name)s: %(message)s%(context)s"
# Attributes every LogRecord has; anything else on a record was passed as ``extra`` and goes into the JSON.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "context"}


@contextlib.contextmanager
def bind_request(**ids: str | None) -> Iterator[None]:
    """Bind ids to every log line written in this context (this task, and tasks it creates) until the end."""
    token = push_log_ids(**ids)
    try:
        yield
    finally:
        pop_log_ids(token)


LogIds = contextvars.Token[dict[str, str] | None]


def push_log_ids(**ids: str | None) -> LogIds:
    """Add ids (those not None or empty) to every log line written in this context; undone by :func:`pop_log_ids`
    with the token returned (what :func:`bind_request` does, for callers that cannot use a ``with``)."""
    current = _CONTEXT.get() or {}
    return _CONTEXT.set({**current, **{k: v for k, v in ids.items() if v}})


def pop_log_ids(token: LogIds) -> None:
    _CONTEXT.reset(token)


class ContextFilter(logging.Filter):
    """Copies the bound ids onto each record (as attributes), and renders them for the console format."""

    def filter(self, record: logging.LogRecord) -> bool:
        bound = _CONTEXT.get() or {}
        for key, value in bound.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        record.context = "".join(f" {k}={v}" for k, v in bound.items())
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, bound ids and ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value if isinstance(value, str | int | float | bool | None) else repr(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(level: str, log_format: LogFormat, stream: Any = None) -> None:
    """Replace the root logger's handlers with one writing ``log_format`` to ``stream`` (stderr by default)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_CONSOLE))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
