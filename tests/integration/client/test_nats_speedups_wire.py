"""A connection with rebaser_core.nats.speedups installed and a plain nats-py one read each other's headers
through a real nats-server exactly as two plain connections would."""

from __future__ import annotations

import asyncio

import nats
import pytest

from rebaser_core.nats import speedups as nats_speedups

HEADERS = {
    "X-CONTENT-TYPE": "application/cbor",
    "Nats-Msg-Id": "01M8SQSHCKR5CP32EC4ZRSEEF9",
    " padded ": " value with spaces ",
    "X-Reply-Inbox": "_INBOX.a.b",
    "Multi": "line\r\nbreak",
    "Unicode": "grüße",
}


async def test_headers_round_trip_both_ways(
    nats_url: str, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Counted, to be sure the installed routines are the ones nats-py called.
    built, parsed = [], []
    block, lines = nats_speedups.header_block, nats_speedups.parse_header_lines
    monkeypatch.setattr(nats_speedups, "header_block", lambda h: built.append(1) or block(h))
    fast = await nats.connect(nats_url)
    plain = await nats.connect(nats_url)
    try:
        assert nats_speedups.install(fast)
        fast._parse_header_lines = lambda raw: parsed.append(1) or lines(raw)
        received: dict[str, asyncio.Future[dict[str, str]]] = {}
        for name, reader in (("to-plain", plain), ("to-fast", fast)):
            future: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
            received[name] = future

            async def on_msg(msg: nats.aio.msg.Msg, future: asyncio.Future[dict[str, str]] = future) -> None:
                future.set_result(dict(msg.headers or {}))

            await reader.subscribe(f"{subject_prefix}.{name}", cb=on_msg)
        await plain.flush()
        await fast.flush()
        await fast.publish(f"{subject_prefix}.to-plain", b"x", headers=HEADERS)
        await plain.publish(f"{subject_prefix}.to-fast", b"x", headers=HEADERS)
        async with asyncio.timeout(10):
            via_fast, via_plain = await received["to-plain"], await received["to-fast"]
        assert via_fast == via_plain
        assert via_fast["padded"] == "value with spaces" and via_fast["Multi"] == "line  break"
        assert built == [1] and parsed == [1]  # one publish and one receipt went through nats_speedups
    finally:
        await fast.close()
        await plain.close()
