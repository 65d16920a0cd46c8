"""Faster equivalents of nats-py's two per-message header routines, installed on one connection at a time.

Every request, reply and record commit carries headers, and nats-py (2.16) handles them in pure Python at a cost
that showed in every profile of the daemon and the client:

- **sending**: ``Client._send_publish`` checks each header name with a regular expression, strips, translates and
  encodes name and value, header by header, on every publish (28 µs for the six headers of a request on a slow
  machine). Here a header name is checked and encoded once, and so are the lines of its first few values: most of
  our headers take one of a handful of values; any other value is stripped, cleaned of CR/LF and encoded as nats-py
  does it;
- **receiving**: ``Client._parse_header_lines`` tests every character of every header name for whitespace with a
  Python generator (``any(c.isspace() for c in key)``). Here one regular-expression search does the same
  (``\\s`` matches exactly what ``str.isspace`` accepts, every code point checked in the tests).

Both produce exactly what nats-py's own do (same bytes on the wire, same header dicts, same errors:
``tests/unit/core/test_nats_speedups.py`` compares them), so :func:`install` only changes speed. It sets the two as
attributes of the one connection object (nats-py looks both up through ``self``), never on nats-py's class, and it
does nothing unless that connection's class still has the methods this was written against: another nats-py
release keeps its own code.
"""

from __future__ import annotations

import re
import types
from typing import Any

from nats import errors
from nats.aio import client as nats_client
from nats.aio.client import Client as NatsClient
from nats.protocol import command as prot_command

__all__ = ["header_block", "install", "parse_header_lines"]

_CRLF = b"\r\n"
_HEADER_LINE = b"NATS/1.0\r\n"
# nats-py's own rules for a header name and for CR/LF inside a value.
_HEADER_KEY = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE_NEWLINES = str.maketrans({"\r": " ", "\n": " "})
# Matches exactly the characters for which str.isspace() is true.
_WHITESPACE = re.compile(r"\s")
# Header name as given -> its encoded "Name: " (b"" for a name that is empty once stripped: nats-py skips those), and
# the whole encoded lines of the first few values seen with it. Most of our headers take one of a handful of values
# (content type, message type, version, stream), so most lines are one lookup; a name whose values are all different
# (a message id) fills its few slots and then costs what it would without them. Bounded: names come from code
# (ours and the application's), but a caller could vary them.
_NAMES: dict[str, tuple[bytes, dict[str, bytes]]] = {}
_MAX_NAMES = 512
_MAX_VALUES_PER_NAME = 8
_MAX_CACHED_VALUE = 128


def _name(name: str) -> tuple[bytes, dict[str, bytes]]:
    cached = _NAMES.get(name)
    if cached is not None:
        return cached
    key = name.strip()
    if not key:
        encoded = b""
    elif not _HEADER_KEY.fullmatch(key):
        raise errors.BadHeaderError(key)
    else:
        encoded = key.encode() + b": "
    entry: tuple[bytes, dict[str, bytes]] = (encoded, {})
    if len(_NAMES) < _MAX_NAMES:
        _NAMES[name] = entry
    return entry


def header_block(headers: dict[str, Any]) -> bytes:
    """The header block nats-py sends for ``headers`` (``NATS/1.0``, one ``Name: value`` line each, a blank line)."""
    parts = [_HEADER_LINE]
    for name, value in headers.items():
        prefix, lines = _name(name)
        if not prefix:
            continue
        if type(value) is str and len(value) > _MAX_CACHED_VALUE:
            # A long value (a record's event window: kilobytes) is neither looked up (hashing it costs more than
            # encoding it) nor copied into a line of its own: its bytes go into the block once.
            value = value.strip()
            if "\r" in value or "\n" in value:
                value = value.translate(_VALUE_NEWLINES)
            parts += (prefix, value.encode(), _CRLF)
            continue
        line = lines.get(value) if type(value) is str else None  # anything else fails below, as in nats-py
        if line is None:
            if type(value) is not str or "\r" in value or "\n" in value:
                line = prefix + value.strip().translate(_VALUE_NEWLINES).encode() + _CRLF
            else:  # (a scan: translating a long value costs several times more)
                line = prefix + value.strip().encode() + _CRLF
            if len(lines) < _MAX_VALUES_PER_NAME:
                lines[value] = line
        parts.append(line)
    parts.append(_CRLF)
    return b"".join(parts)


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """nats-py's ``Client._parse_header_lines``, with one search per name instead of a generator per character."""
    out: dict[str, str] = {}
    for line in raw.split(_CRLF):
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if _WHITESPACE.search(key) is not None:
            continue
        out[key] = value.strip().decode("utf-8", "replace")
    return out


async def _send_publish(
    self: Any, subject: str, reply: str, payload: bytes, payload_size: int, headers: dict[str, Any] | None
) -> None:
    # nats-py 2.16's Client._send_publish, but for the header block (see the module docstring).
    if subject == "":
        raise errors.BadSubjectError
    if headers is None:
        pub_cmd = prot_command.pub_cmd(subject, reply, payload)
    else:
        pub_cmd = prot_command.hpub_cmd(subject, reply, header_block(headers), payload)
    self.stats["out_msgs"] += 1
    self.stats["out_bytes"] += payload_size
    await self._send_command(pub_cmd)
    if self._flush_queue is not None and self._flush_queue.empty():
        await self._flush_pending()


_SEND_PUBLISH_ARGS = ("self", "subject", "reply", "payload", "payload_size", "headers")


def _compatible(cls: type) -> bool:
    """Whether ``cls`` is the nats-py client this module mirrors (2.16's private methods, as they were read)."""
    send = getattr(cls, "_send_publish", None)
    code = getattr(send, "__code__", None)
    return (
        code is not None
        and code.co_varnames[: len(_SEND_PUBLISH_ARGS)] == _SEND_PUBLISH_ARGS
        and isinstance(cls.__dict__.get("_parse_header_lines"), staticmethod)
        and all(hasattr(cls, name) for name in ("_send_command", "_flush_pending"))
        and hasattr(prot_command, "hpub_cmd")
        and getattr(nats_client, "_HEADER_KEY_RE", None) is not None
        and nats_client._HEADER_KEY_RE.pattern == _HEADER_KEY.pattern
    )


def install(nc: NatsClient) -> bool:
    """Use the faster header routines on ``nc`` (idempotent); False if its nats-py is not the one they mirror."""
    if not _compatible(type(nc)):
        return False
    nc._send_publish = types.MethodType(_send_publish, nc)  # type: ignore[method-assign]
    nc._parse_header_lines = parse_header_lines  # type: ignore[method-assign]
    return True
