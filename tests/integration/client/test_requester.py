"""Request-reply for the hot paths (rebaser_core.nats.requester): ``send``, whose answer goes to a callback, and
``request`` and ``expect``, whose answer settles a future; all expired by one timer."""

from __future__ import annotations

import asyncio

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_core.embedded import NatsServer
from rebaser_core.nats.requester import Answer, Requester
from rebaser_core.testing import wait_for


async def test_send_hands_each_answer_to_its_callback_once(nc: NatsClient, subject_prefix: str) -> None:
    async def echo(msg: Msg) -> None:
        await nc.publish(msg.reply, b"re:" + msg.data)

    sub = await nc.subscribe(f"{subject_prefix}.echo", cb=echo)
    requester = Requester(nc)
    answers: dict[int, list[Answer]] = {i: [] for i in range(20)}
    for i in range(20):
        await requester.send(
            f"{subject_prefix}.echo", str(i).encode(), timeout=5, on_answer=answers[i].append
        )
    await wait_for(lambda: all(answers.values()), timeout=5, message="every request answered")
    assert all(len(a) == 1 and isinstance(a[0], Msg) for a in answers.values())
    assert [a[0].data for a in answers.values()] == [f"re:{i}".encode() for i in range(20)]  # type: ignore[union-attr]
    assert not requester._callbacks  # nothing left to expire
    await sub.unsubscribe()
    await requester.close()


async def test_send_reports_no_responders_timeouts_and_close(nc: NatsClient, subject_prefix: str) -> None:
    requester = Requester(nc)
    nobody: list[Answer] = []
    await requester.send(f"{subject_prefix}.nobody", b"", timeout=5, on_answer=nobody.append)
    await wait_for(lambda: nobody, timeout=5, message="no-responders status reported")
    assert isinstance(nobody[0], nats.errors.NoRespondersError)
    await requester.close()

    requester = Requester(nc)  # its first send arms the timer for 30 s

    async def ignore(msg: Msg) -> None:
        return None

    silent = await nc.subscribe(f"{subject_prefix}.silent", cb=ignore)
    early: list[Answer] = []
    late: list[Answer] = []
    # One timer serves every pending send: the one with the short deadline times out, the other still waits.
    await requester.send(f"{subject_prefix}.silent", b"", timeout=30, on_answer=late.append)
    await requester.send(f"{subject_prefix}.silent", b"", timeout=0.2, on_answer=early.append)
    await wait_for(lambda: early, timeout=10, message="the short send timed out")
    assert isinstance(early[0], nats.errors.TimeoutError) and not late
    await requester.close()  # whatever still waits is told at once: no answer can come any more
    assert len(late) == 1 and isinstance(late[0], nats.errors.ConnectionClosedError)
    await silent.unsubscribe()


async def test_request_times_out_on_the_shared_timer_and_leaves_nothing(
    nc: NatsClient, subject_prefix: str
) -> None:
    async def ignore(msg: Msg) -> None:
        return None

    silent = await nc.subscribe(f"{subject_prefix}.silent", cb=ignore)
    requester = Requester(nc)
    waiting = asyncio.create_task(requester.request(f"{subject_prefix}.silent", timeout=30))
    await wait_for(lambda: requester._callbacks, timeout=5, message="the long request is pending")
    # The short one, sent after the long one armed the timer for 30 s, still times out in time.
    with pytest.raises(nats.errors.TimeoutError):
        await asyncio.wait_for(requester.request(f"{subject_prefix}.silent", timeout=0.2), timeout=10)
    assert not waiting.done()
    with pytest.raises(nats.errors.NoRespondersError):
        await requester.request(f"{subject_prefix}.nobody", timeout=5)
    waiting.cancel()  # a caller that stops waiting takes its entry with it
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not requester._callbacks

    pending = asyncio.create_task(requester.request(f"{subject_prefix}.silent", timeout=30))
    reply_to, expected = requester.expect(30)
    await wait_for(lambda: len(requester._callbacks) == 2, timeout=5, message="both pending")
    await requester.close()  # no answer can come any more: both are told at once
    with pytest.raises(nats.errors.ConnectionClosedError):
        await pending
    with pytest.raises(nats.errors.ConnectionClosedError):
        await expected
    assert reply_to.startswith("_INBOX.")
    await silent.unsubscribe()


async def test_close_on_a_closed_connection_still_fails_what_waits(
    nats_url: str, subject_prefix: str
) -> None:
    own = await nats.connect(nats_url)
    requester = Requester(own)
    answers: list[Answer] = []

    async def ignore(msg: Msg) -> None:
        return None

    await own.subscribe(f"{subject_prefix}.silent", cb=ignore)
    with pytest.raises(ValueError, match="NaN"):  # refused before it is sent: it would stall the shared timer
        await requester.send(f"{subject_prefix}.silent", b"", timeout=float("nan"), on_answer=answers.append)
    await requester.send(f"{subject_prefix}.silent", b"", timeout=30, on_answer=answers.append)
    pending = asyncio.create_task(requester.request(f"{subject_prefix}.silent", timeout=30))
    await wait_for(lambda: len(requester._callbacks) == 2, timeout=5, message="both pending")
    await own.close()
    with pytest.raises(nats.errors.Error):
        await requester.close()  # unsubscribing fails on a closed connection: after what waits was told
    assert len(answers) == 1 and isinstance(answers[0], nats.errors.ConnectionClosedError)
    with pytest.raises(nats.errors.ConnectionClosedError):
        await pending


async def test_fail_lost_ends_the_calls_of_a_lost_connection_at_once(
    own_server: NatsServer, subject_prefix: str
) -> None:
    own = await nats.connect(own_server.url, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
    requester = Requester(own)

    async def ignore(msg: Msg) -> None:
        return None

    try:
        await own.subscribe(f"{subject_prefix}.silent", cb=ignore)
        before: list[Answer] = []
        await requester.send(f"{subject_prefix}.silent", b"", timeout=60, on_answer=before.append)
        await own.flush()
        assert requester.fail_lost() == 0 and not before  # no reconnect yet: nothing is lost

        await asyncio.to_thread(own_server.stop, keep_files=True)
        await wait_for(lambda: not own.is_connected, timeout=10, message="disconnected")
        # Made while disconnected: waits in nats-py's reconnect buffer and goes out on the next connection.
        buffered: list[Answer] = []
        await requester.send(f"{subject_prefix}.silent", b"", timeout=60, on_answer=buffered.append)
        await asyncio.to_thread(own_server.start)
        await wait_for(lambda: own.is_connected, timeout=10, message="reconnected")
        after: list[Answer] = []
        await requester.send(f"{subject_prefix}.silent", b"", timeout=60, on_answer=after.append)

        assert requester.fail_lost() == 1
        assert len(before) == 1 and isinstance(before[0], nats.errors.TimeoutError)  # at once, not after 60 s
        assert not buffered and not after
        assert len(requester._callbacks) == 2
        assert requester.fail_lost() == 0  # told once
    finally:
        await requester.close()
        await own.close()
