"""Micro-benchmarks of the per-message work that needs no server: decoding a request, a reply and a change-set
record, and encoding a record. ``python bench/micro.py`` prints microseconds per call (best of 5 repeats).

These are the figures quoted in docs/BENCHMARKS.md for the decoding steps; the end-to-end ratios come from
``bench/bench.py``.
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    ENQUEUE_UPDATES_RESPONSE,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    InlineUpdates,
    SetLiteral,
    SuccessStatus,
)
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_server.state import ChangeSetRecord


def _per_call(fn: object, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6  # type: ignore[arg-type]


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
    rows = [
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
        (f"decode a record, 64 replies ({len(data)} B)", lambda: ChangeSetRecord.decode(data), 2_000),
        ("encode that record", record.encode, 20_000),
    ]
    for name, fn, number in rows:
        print(f"{_per_call(fn, number):8.1f} us  {name}")


if __name__ == "__main__":
    main()
