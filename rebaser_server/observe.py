"""What the daemon records about each request it handles: metrics, log context (and, where enabled, a trace span).

The request path calls :meth:`Observer.request` once per request delivery, around its handling; everything else
about observability reads the daemon's state from outside (``rebaser_server.metrics``), so the processor keeps a
single hook.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from nats.aio.msg import Msg

from rebaser_core import headers as h
from rebaser_server.app import ChangeSet
from rebaser_server.logs import bind_request
from rebaser_server.metrics import RequestMetrics, arrival_of

__all__ = ["Observer"]


class Observer:
    def __init__(self) -> None:
        self.metrics = RequestMetrics()

    @contextlib.contextmanager
    def request(self, msg: Msg, change_set: ChangeSet) -> Iterator[None]:
        """Around the handling of one request delivery (also when it fails)."""
        request_id = (msg.headers or {}).get(h.NATS_MSG_ID)
        with (
            bind_request(
                request_id=request_id,
                workspace_id=str(change_set.workspace_id),
                change_set_id=str(change_set.change_set_id),
            ),
            self.metrics.request(arrival_of(msg)),
        ):
            yield
