"""Request-reply for the hot paths (rebaser_core.requester): ``send``, whose answer goes to a callback."""

from __future__ import annotations

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_core.requester import Answer, Requester
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
