"""Removing messages stored on malformed subjects: they would otherwise stay in their stream for good.

The streams' subject filters (``rebaser.requests.*.*``, ``rebaser.tasks.*.*.process``) keep most junk out, but a
token can still be anything (``*``, ``>``, 3,000 characters, not a ULID), and a stream created by an older version
takes any number of tokens. No daemon will ever consume such a message, so the orphan sweep hands them here:
requests are dead-lettered with the reason, tasks (empty) are dropped, both are deleted by sequence.

A junk subject cannot be used as a filter to find or purge its messages: a literal ``*`` or ``>`` token would act
as a wildcard and match real requests. So messages are looked up one at a time (direct get, next by subject) and
only those whose subject is *exactly* the junk subject are touched. The work per sweep is bounded; a cursor per
subject resumes where the last sweep stopped.
"""

from __future__ import annotations

import contextlib
import logging

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rebaser_server.changeset.replies import Replies

__all__ = ["JunkRemover"]

log = logging.getLogger(__name__)

# Lookups per sweep, over all junk subjects: a flood of junk is removed over a few sweeps, never in one long stall.
_LOOKUPS_PER_SWEEP = 1000


class JunkRemover:
    def __init__(self, js: JetStreamContext, replies: Replies) -> None:
        self._js = js
        self._replies = replies
        self._cursors: dict[tuple[str, str], int] = {}  # (stream, subject) -> last sequence looked at
        self.removed = 0

    async def remove(self, stream: str, subjects: dict[str, str], *, dead_letter: bool) -> int:
        """Delete the messages of ``stream`` stored on each of ``subjects`` (subject -> why it is malformed),
        dead-lettering them first if ``dead_letter``; return how many were removed."""
        budget, removed = _LOOKUPS_PER_SWEEP, 0
        live = {(stream, subject) for subject in subjects}
        self._cursors = {k: v for k, v in self._cursors.items() if k[0] != stream or k in live}
        for subject, why in subjects.items():
            key = (stream, subject)
            while budget > 0:
                budget -= 1
                try:
                    msg = await self._js.get_msg(
                        stream, seq=self._cursors.get(key, 0) + 1, subject=subject, next=True, direct=True
                    )
                except NotFoundError:
                    self._cursors.pop(key, None)  # nothing left after the cursor: start over next time
                    break
                seq = msg.seq
                if seq is None:
                    break
                self._cursors[key] = seq
                if msg.subject != subject:
                    continue  # matched because the junk subject acted as a wildcard: a real message, left alone
                if dead_letter:
                    await self._replies.dead_letter_stored(
                        subject, msg.headers, msg.data or b"", seq, f"malformed subject: {why}"
                    )
                with contextlib.suppress(NotFoundError):  # removed meanwhile (another daemon's sweep)
                    await self._js.delete_msg(stream, seq)
                removed += 1
        if removed:
            self.removed += removed
            log.warning(
                "removed %d messages on %d malformed subjects from %s", removed, len(subjects), stream
            )
        return removed
