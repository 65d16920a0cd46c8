"""Replies to callers and copies to the dead-letter stream: :class:`Replies`, one per daemon.

Both are carried out by a commit group's flush (:mod:`~rebaser_server.changeset.group`), in its order: the dead
letters before the commit (a crash between the two leaves the request unprocessed, so the next owner copies it
again, deduplicated by its stream sequence), the replies after it (a reply never announces what a crash could
still undo).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_core import headers as h
from rebaser_core.api import (
    ENQUEUE_UPDATES_RESPONSE,
    ContentType,
    EnqueueUpdatesResponse,
    oldest_form,
    reads_up_to,
)
from rebaser_core.api.success_reply import encode_success
from rebaser_core.dead_letter_copy import bounded_copy, dead_letter_marks, dead_letter_subject
from rebaser_core.errors import InvalidReplyInbox, RebaserRefused, Unsupported
from rebaser_core.inbox import reply_inbox_of
from rebaser_core.nats.tasks import check_pub_ack
from rebaser_core.settings import Settings
from rebaser_core.subjects import Subjects
from rebaser_server.changeset.context import Stats
from rebaser_server.ops.observe import Observer

__all__ = ["UNCHECKED", "Replies", "Unchecked"]

log = logging.getLogger(__name__)


# Workspaces whose dead letters since their last purge a daemon counts at most (_keep_workspace_share).
_COUNTED_WORKSPACES = 10_000


class Unchecked:
    """The reply inbox is still to be read from the request's headers and checked."""


UNCHECKED = Unchecked()


class Replies:
    """Replies and dead letters of one daemon, on its connection."""

    def __init__(
        self, nc: NatsClient, settings: Settings, subjects: Subjects, stats: Stats, observe: Observer
    ) -> None:
        self._nc = nc
        self._settings = settings
        self.subjects = subjects  # shard 0's names and the shared ones (dead letters)
        self._stats = stats
        self.stats = stats  # the daemon's counters, for the sweeps that share this daemon's replies
        self._observe = observe
        # Dead letters stored per workspace (its subject head) since its last purge (_keep_workspace_share).
        self._letters_since_purge: dict[str, int] = {}

    def inbox(self, headers: Mapping[str, str] | None) -> str | None:
        """The request's reply inbox if the daemon may publish to it (None: no reply wanted); else
        :class:`InvalidReplyInbox`, and the request is refused (``rebaser_core.inbox`` has the rule)."""
        return reply_inbox_of(headers, self._settings.reply_inbox_prefix, self.subjects)

    async def send(
        self,
        request_headers: dict[str, str],
        response: EnqueueUpdatesResponse,
        inbox: str | Unchecked | None = UNCHECKED,
    ) -> None:
        """Reply on the request's ``X-Reply-Inbox`` (if it has a valid one), in the content type the caller used.
        ``inbox``: the request's inbox as :meth:`inbox` returned it, if the caller checked it already.

        Replies are core NATS, at most once: a caller that missed one still has its request applied, and asking
        again with the same request id is answered from the idempotency record.
        """
        if isinstance(inbox, Unchecked):
            try:
                inbox = self.inbox(request_headers)
            except InvalidReplyInbox:
                return  # the request was refused for it (dead-lettered); there is nowhere safe to answer
        if not inbox:
            return
        try:
            content_type = ContentType.parse(
                h.get_header(request_headers, h.CONTENT_TYPE) or ContentType.CBOR.value
            )
        except Unsupported:
            # The caller's own type is unusable; JSON is the most readable fallback.
            content_type = ContentType.JSON
        # The oldest version that carries it: a client that only knows version 1 reads all but a refusal. A success,
        # the commonest, without pydantic (the same bytes: rebaser_core.api.success_reply).
        encoded = encode_success(response, content_type)
        if encoded is None:
            reads = reads_up_to(h.get_header(request_headers, h.REPLY_VERSION))
            encoded = ENQUEUE_UPDATES_RESPONSE.encode(oldest_form(response, reads), content_type)
        headers, body = encoded
        try:
            # Its span, in the trace context of the request it answers.
            with self._observe.reply(request_headers, headers):
                await self._nc.publish(inbox, body, headers=headers)
        except Exception as err:
            log.warning("reply to %s failed: %s", inbox, err)

    async def dead_letter(self, msg: Msg, seq: int, reason: str, *, trace: str | None = None) -> bool:
        """Copy the request, bounded, with the reason, to the dead-letter stream and wait for the stream's ack.

        Never raises: a request being dead-lettered must end whatever happens to its copy. If JetStream refuses
        the copy it is tried once more without the original headers and body; if that fails too (or the stream
        cannot be reached), the copy is given up, logged and counted (``dead_letter_failures``), and False
        returned.
        """
        return await self.dead_letter_stored(msg.subject, msg.headers, msg.data, seq, reason, trace=trace)

    async def dead_letter_stored(
        self,
        subject: str,
        original_headers: Mapping[str, str] | None,
        data: bytes,
        seq: int,
        reason: str,
        *,
        trace: str | None = None,
    ) -> bool:
        """:meth:`dead_letter` for a stored request given by its parts (the orphan sweep reads them by sequence)."""
        target = dead_letter_subject(self.subjects, subject)
        marks = dead_letter_marks(self.subjects, subject, seq, reason, trace=trace)
        reason = marks[h.DEAD_LETTER_REASON]
        headers, body = bounded_copy(original_headers, data, self._settings.dead_letter_max_body)
        try:
            await self._store(target, body, {**headers, **marks})
        except RebaserRefused as err:
            log.warning("dead letter of seq %d refused (%s); storing it without headers and body", seq, err)
            try:
                await self._store(target, b"", {**marks, h.DEAD_LETTER_TRUNCATED: str(len(data))})
            except Exception as again:
                return self._given_up(seq, marks[h.DEAD_LETTER_SUBJECT], reason, again)
        except Exception as err:
            return self._given_up(seq, marks[h.DEAD_LETTER_SUBJECT], reason, err)
        self._stats.requests_dead_lettered += 1
        log.warning("dead-lettered request seq %d of %s: %s", seq, marks[h.DEAD_LETTER_SUBJECT][:200], reason)
        await self._keep_workspace_share(target)
        return True

    async def _keep_workspace_share(self, target: str) -> None:
        """Keep the workspace of dead letter ``target`` at ``dead_letter_max_per_workspace`` letters: purge its
        oldest (a purge filtered on the workspace, keeping the newest). Not after every letter: after every k-th
        this daemon stores for the workspace (k: a hundredth of the cap, from 1 to 100), so a workspace may pass
        its cap by k - 1 letters per daemon. Best effort: a failed purge is tried again at the next k-th letter."""
        cap = self._settings.dead_letter_max_per_workspace
        if cap < 0 or target == self.subjects.dead_letter_malformed:
            return
        workspace_head = target.rpartition(".")[0]  # dlq.rebaser.requests.<wk>
        every = max(1, min(100, cap // 100))
        count = self._letters_since_purge.get(workspace_head, 0) + 1
        if count < every:
            if len(self._letters_since_purge) >= _COUNTED_WORKSPACES:
                self._letters_since_purge.clear()  # bounded memory; costs at most k - 1 more letters each
            self._letters_since_purge[workspace_head] = count
            return
        self._letters_since_purge.pop(workspace_head, None)
        purge: dict[str, object] = {"filter": f"{workspace_head}.*"}
        if cap:
            purge["keep"] = cap
        try:
            reply = await self._nc.request(
                f"$JS.API.STREAM.PURGE.{self.subjects.dead_letter_stream}",
                json.dumps(purge).encode(),
                timeout=self._settings.nats_timeout,
            )
            answer = json.loads(reply.data)
            if "error" in answer:
                raise RebaserRefused(str(answer["error"]))
        except Exception as err:
            log.warning("keeping %s.* at %d dead letters failed: %s", workspace_head, cap, err)
            return
        if answer.get("purged"):
            self._stats.dead_letters_evicted += int(answer["purged"])

    async def _store(self, subject: str, body: bytes, headers: dict[str, str]) -> None:
        try:
            reply = await self._nc.request(
                subject, body, headers=headers, timeout=self._settings.nats_timeout
            )
        except nats.errors.NoRespondersError:
            raise RebaserRefused(f"no stream stores {subject}") from None
        check_pub_ack(reply.data, subject)

    def _given_up(self, seq: int, subject: str, reason: str, err: BaseException) -> bool:
        self._stats.dead_letter_failures += 1
        log.error(
            "could not dead-letter request seq %d of %s (%s); it is dropped: %s", seq, subject, err, reason
        )
        return False
