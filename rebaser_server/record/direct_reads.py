"""Reading the last message on a subject as the stream leader has it: by direct get where only the leader can
answer one, else by ``STREAM.MSG.GET`` (which the leader answers).

A direct get costs nats-server a quarter of a ``STREAM.MSG.GET`` (``bench/server_ops.py``), and an activation makes
three reads that must not miss a write (rebaser_core.nats.requester.last_message_direct). But any server holding the
stream answers a direct get: a replica that lags behind the leader, a peer still catching up while the stream
moves, or a mirror made with ``mirror_direct``. So a stream qualifies only if its *actual* configuration, read
from the server (not this daemon's ``replicas`` setting, which may differ from what an older deployment made),
allows direct gets, has one replica, and no mirror answers for it (``STREAM.INFO`` lists such mirrors, the stream
itself first, as ``alternates``). The answer is kept for a minute: a mirror made meanwhile is noticed within one.
"""

from __future__ import annotations

import base64
import time

from rebaser_core.nats.requester import Requester, js_api, last_message, last_message_direct
from rebaser_core.nats.speedups import parse_header_lines

__all__ = ["DirectReads", "Stored", "single_answerer"]

_RECHECK = 60.0  # seconds an answer is kept


def single_answerer(info: dict[str, object]) -> bool:
    """From a ``STREAM.INFO`` answer: can only the leader answer a direct get of this stream?"""
    config = info.get("config")
    if not isinstance(config, dict):
        return False
    alternates = info.get("alternates") or []
    return (
        config.get("allow_direct") is True
        and config.get("num_replicas", 1) == 1
        and isinstance(alternates, list)
        and len(alternates) <= 1
    )


class Stored:
    """A stream's message as either read gives it: sequence, payload, headers (None if it has none)."""

    __slots__ = ("data", "headers", "seq")

    def __init__(self, seq: int, data: bytes, headers: dict[str, str] | None) -> None:
        self.seq = seq
        self.data = data
        self.headers = headers


class DirectReads:
    def __init__(self, requester: Requester, timeout: float) -> None:
        self._requester = requester
        self._timeout = timeout
        self._known: dict[str, tuple[bool, float]] = {}  # stream -> (allowed, when checked: monotonic)

    async def allowed(self, stream: str) -> bool:
        known = self._known.get(stream)
        now = time.monotonic()
        if known is not None and now - known[1] < _RECHECK:
            return known[0]
        try:
            allowed = single_answerer(
                await js_api(self._requester, f"STREAM.INFO.{stream}", timeout=self._timeout)
            )
        except Exception:
            # Not known now (NATS trouble): read from the leader this time, and ask again next time.
            return False
        self._known[stream] = (allowed, now)
        return allowed

    async def last_message(self, stream: str, subject: str, *, timeout: float) -> Stored | None:
        """The last message on ``subject`` as the stream leader has it, or None if the subject has none."""
        if await self.allowed(stream):
            found = await last_message_direct(self._requester, stream, subject, timeout=timeout)
            if found is None:
                return None
            assert found.headers is not None  # last_message_direct returns only messages with Nats-Sequence
            return Stored(int(found.headers["Nats-Sequence"]), found.data, found.headers)
        message = await last_message(self._requester, stream, subject, timeout=timeout)
        if message is None:
            return None
        raw = message.get("hdrs")
        return Stored(
            int(message["seq"]),
            base64.b64decode(message.get("data") or ""),
            parse_header_lines(base64.b64decode(raw)) if raw else None,
        )

    def forget(self) -> None:
        """Ask again at the next read (after a reconnect: the server may have been replaced)."""
        self._known.clear()
