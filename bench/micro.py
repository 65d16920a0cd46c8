"""Micro-benchmarks of the per-message work that needs no server: decoding a request, a reply and a change-set
record, encoding a record, and the built-in app's pure work for one request on a small and a large snapshot.
``python bench/micro.py`` prints microseconds per call (best of 5 repeats).

These are the figures quoted in docs/BENCHMARKS.md for the decoding steps; the end-to-end ratios come from
``bench/bench.py``.
"""

from __future__ import annotations

import contextlib
import sys
import time
import timeit
from pathlib import Path

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from nats.aio.client import Client as NatsClient

from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    ENQUEUE_UPDATES_RESPONSE,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    InlineUpdates,
    SetLiteral,
    SuccessStatus,
    oldest_form,
)
from rebaser_core.api.codec import ContentType
from rebaser_core.api.success_reply import decode_success, encode_success
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats import speedups as nats_speedups
from rebaser_server.apps.snapshots.app import _rebased
from rebaser_server.apps.snapshots.limits import Limits
from rebaser_server.apps.snapshots.model import Attribute, Snapshot
from rebaser_server.ops.metrics import RequestMetrics
from rebaser_server.record.model import ChangeSetRecord


class _Recorder:
    """Just enough of a nats-py client for ``_send_publish`` (what it sends is dropped)."""

    def __init__(self) -> None:
        self.stats = {"out_msgs": 0, "out_bytes": 0}
        self._flush_queue = None

    async def _send_command(self, cmd: bytes, priority: bool = False) -> None:
        return None

    async def _flush_pending(self, force_flush: bool = False) -> None:
        return None


def _publisher(send_publish: object, headers: dict[str, str]) -> object:
    """One publish with ``headers`` through ``send_publish`` (nats-py's or ours), without an event loop."""
    recorder = _Recorder()

    def publish() -> None:
        coro = send_publish(recorder, "rebaser.requests.a.b", "_INBOX.x.1", b"x" * 100, 100, headers)  # type: ignore[operator]
        with contextlib.suppress(StopIteration):
            coro.send(None)

    return publish


def _per_call(fn: object, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6  # type: ignore[arg-type]


def _app_step(attributes: int) -> tuple[str, object]:
    """The built-in app's work for one request of one literal onto a snapshot of ``attributes`` attributes: the
    rebase, the settle (nothing downstream), the encoding and the content address (``SnapshotApp.apply`` without
    its I/O). The same snapshot each time, as a change set's current one is between its requests."""
    snapshot = Snapshot(
        {
            f"/a{i}": Attribute(value={"x": i, "name": f"attribute {i}", "tags": ["a", "b"]})
            for i in range(attributes)
        }
    )
    updates = [SetLiteral(path="/a0", value=5)]
    limits = Limits()

    def step() -> None:
        _, data = _rebased(snapshot, updates, limits)
        Snapshot.address_of(data)

    name = f"the built-in app's step, a snapshot of {attributes:,} attribute{'s' if attributes > 1 else ''}"
    return f"{name} ({len(snapshot.encode()):,} B)", step


def main() -> None:
    ws, cs = WorkspacePk.new(), ChangeSetId.new()
    request = EnqueueUpdatesRequest(
        id=RequestId.new(),
        workspace_id=ws,
        change_set_id=cs,
        updates=InlineUpdates(updates=[SetLiteral(path="/n", value=5)]),
    )
    request_headers, request_body = ENQUEUE_UPDATES_REQUEST.encode(request, reply_inbox="_INBOX.a.b")
    response = EnqueueUpdatesResponse(
        id=request.id, workspace_id=ws, change_set_id=cs, status=SuccessStatus(updates_performed=1)
    )
    reply_headers, reply_body = ENQUEUE_UPDATES_RESPONSE.encode(response)
    record = ChangeSetRecord(epoch=1, owner="daemon", state={"n": 5})
    for _ in range(64):  # a full idempotency window (the default)
        rid = RequestId.new()
        record = record.with_reply(
            str(rid),
            EnqueueUpdatesResponse(id=rid, workspace_id=ws, change_set_id=cs, status=response.status),
            64,
        )
    data = record.encode()
    headers = {**request_headers, "Nats-Expected-Stream": "REBASER_REQUESTS"}
    raw_headers = nats_speedups.header_block(headers)[len(b"NATS/1.0\r\n") :]
    metrics, arrived = RequestMetrics(), time.time()

    def observe_twice() -> None:
        metrics.ended(metrics.started(arrived))

    rows = [
        ("a fresh request id", RequestId.new, 50_000),
        (
            f"publish a request's {len(headers)} headers: nats-py",
            _publisher(NatsClient._send_publish, headers),
            20_000,
        ),
        (
            f"publish a request's {len(headers)} headers: nats_speedups",
            _publisher(nats_speedups._send_publish, headers),
            20_000,
        ),
        ("parse them on receipt: nats-py", lambda: NatsClient._parse_header_lines(raw_headers), 20_000),
        (
            "parse them on receipt: nats_speedups",
            lambda: nats_speedups.parse_header_lines(raw_headers),
            20_000,
        ),
        ("the two latency histograms of a request", observe_twice, 50_000),
        (
            f"decode a request ({len(request_body)} B)",
            lambda: ENQUEUE_UPDATES_REQUEST.decode(request_headers, request_body),
            20_000,
        ),
        (
            f"decode a reply ({len(reply_body)} B)",
            lambda: ENQUEUE_UPDATES_RESPONSE.decode(reply_headers, reply_body),
            20_000,
        ),
        (
            "decode a success reply: the fast path (the client's)",
            lambda: decode_success(reply_headers, reply_body, request),
            20_000,
        ),
        (
            "encode a success reply: in full",
            lambda: ENQUEUE_UPDATES_RESPONSE.encode(oldest_form(response), ContentType.CBOR),
            20_000,
        ),
        (
            "encode a success reply: the fast path (the daemon's)",
            lambda: encode_success(response, ContentType.CBOR),
            20_000,
        ),
        (f"decode a record, 64 replies ({len(data)} B)", lambda: ChangeSetRecord.decode(data), 2_000),
        ("encode that record", record.encode, 20_000),
        (*_app_step(1), 20_000),
        (*_app_step(1000), 200),
    ]
    for name, fn, number in rows:
        print(f"{_per_call(fn, number):8.1f} us  {name}")


if __name__ == "__main__":
    main()
