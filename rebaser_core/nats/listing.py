"""A stream's subjects, every page of them.

A stream info filtered on subjects lists each subject with its message count, but nats-server sends at most 100,000
subjects in one answer (``JSMaxSubjectDetails``), with the total and an offset to ask for the next page; nats-py's
``stream_info`` reads the first page only. At scale (100,000 change sets with requests queued, or tasks) a listing
that stops there misses the rest without a word: the orphan sweep, the lease reaper's hand-back and the intake's
rescan all list subjects, so they list them here.
"""

from __future__ import annotations

import json

from nats.js import JetStreamContext

__all__ = ["stream_subjects"]


async def stream_subjects(
    js: JetStreamContext, stream: str, filter_: str, *, timeout: float = 5.0
) -> dict[str, int]:
    """Every subject of ``stream`` that matches ``filter_``, with its message count (empty if none)."""
    found: dict[str, int] = {}
    offset = 0
    while True:
        request = json.dumps({"subjects_filter": filter_, "offset": offset}).encode()
        answer = await js._api_request(f"{js._prefix}.STREAM.INFO.{stream}", request, timeout=timeout)
        page = (answer.get("state") or {}).get("subjects") or {}
        found.update(page)
        offset += len(page)
        if not page or offset >= int(answer.get("total", 0)):
            return found
