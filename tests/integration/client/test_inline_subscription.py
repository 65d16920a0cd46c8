"""Subscriptions handled as nats-py reads them (rebaser_core.nats.inline_subscription)."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_core.nats import inline_subscription
from rebaser_core.nats.inline_subscription import subscribe_inline
from rebaser_core.testing import wait_for


async def test_every_message_reaches_the_handler_without_a_task_of_its_own(
    nc: NatsClient, subject_prefix: str
) -> None:
    assert inline_subscription._SUPPORTED  # the nats-py this project pins has the hook
    seen: list[tuple[bytes, bool]] = []
    current = asyncio.current_task

    def handler(msg: Msg) -> None:
        task = current()
        seen.append((msg.data, task is not None and "read" in (task.get_coro().__qualname__ or "")))

    before = len(asyncio.all_tasks())
    sub = await subscribe_inline(nc, f"{subject_prefix}.inline.*", handler)
    assert len(asyncio.all_tasks()) == before  # no task per subscription either
    for i in range(50):
        await nc.publish(f"{subject_prefix}.inline.{i}", str(i).encode())
    await wait_for(lambda: len(seen) == 50, timeout=5, message="all delivered")
    assert [data for data, _ in seen] == [str(i).encode() for i in range(50)]  # in order
    assert all(in_read_loop for _, in_read_loop in seen)  # called from nats-py's read loop itself
    await sub.unsubscribe()
    await nc.publish(f"{subject_prefix}.inline.x", b"late")
    await nc.flush()
    assert len(seen) == 50


async def test_a_failing_handler_does_not_break_the_connection(nc: NatsClient, subject_prefix: str) -> None:
    handled: list[bytes] = []

    def handler(msg: Msg) -> None:
        if msg.data == b"bad":
            raise ValueError("hostile")
        handled.append(msg.data)

    await subscribe_inline(nc, f"{subject_prefix}.fragile", handler)
    for data in (b"one", b"bad", b"two"):
        await nc.publish(f"{subject_prefix}.fragile", data)
    await wait_for(lambda: handled == [b"one", b"two"], timeout=5, message="later messages handled")
    reply = await nc.request("$JS.API.INFO", b"", timeout=5)  # the connection still reads
    assert reply.data


async def test_without_the_hook_it_is_an_ordinary_callback_subscription(
    nc: NatsClient, subject_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inline_subscription, "_SUPPORTED", False)
    handled: list[bytes] = []
    sub = await subscribe_inline(nc, f"{subject_prefix}.old", lambda msg: handled.append(msg.data))
    await nc.publish(f"{subject_prefix}.old", b"x")
    await wait_for(lambda: handled == [b"x"], timeout=5, message="delivered")
    await sub.unsubscribe()
