"""Publishing a change set's task: the one protocol rule both client and daemons follow.

The tasks stream keeps at most one message per change set (discard-new-per-subject). A publish that is
refused with err_code 10077 means "this change set already has a task", and that is success: whoever holds it
will see the request, because it was published first and the owner checks for queued requests after releasing.
"""

from __future__ import annotations

import json

from nats.aio.client import Client as NatsClient
from nats.errors import NoRespondersError

from rebaser_core.errors import RebaserBusy, RebaserRefused, RebaserUnavailable

__all__ = ["TASK_EXISTS", "check_pub_ack", "publish_task"]

TASK_EXISTS = 10077  # "maximum messages per subject exceeded" on the tasks stream
# nats-server 2.15 reports every "stream full" limit (messages, bytes, per subject) as 10077; 10054 is a message
# over the size limit, which retrying cannot fix (RebaserRefused).
STREAM_FULL = frozenset({10077})


def check_pub_ack(data: bytes, subject: str, *, allow: tuple[int, ...] = ()) -> int | None:
    """The stream sequence of a JetStream publish ack; None for a refusal whose err_code is in ``allow``;
    a typed error for any other refusal."""
    try:
        reply = json.loads(data)
    except ValueError:
        raise RebaserUnavailable(f"publish to {subject}: unreadable JetStream reply {data[:80]!r}") from None
    error = reply.get("error")
    if error is None:
        return int(reply.get("seq", 0))
    code = int(error.get("err_code", 0))
    if code in allow:
        return None
    text = f"publish to {subject} refused: {error.get('description', '')} (err_code {code})"
    if code in STREAM_FULL:
        raise RebaserBusy(text, retry_after=1.0)
    if int(error.get("code", 0)) == 503:
        raise RebaserUnavailable(text)
    raise RebaserRefused(text)


async def publish_task(nc: NatsClient, subject: str, *, timeout: float = 5.0) -> bool:
    """Publish an empty task; True if created, False if the change set already had one."""
    try:
        msg = await nc.request(subject, b"", timeout=timeout)
    except NoRespondersError:
        raise RebaserUnavailable(f"no JetStream stream answers on {subject}") from None
    except TimeoutError:
        raise RebaserUnavailable(f"publish to {subject} timed out after {timeout}s") from None
    return check_pub_ack(msg.data, subject, allow=(TASK_EXISTS,)) is not None
