"""A handed-back task survives a restart of nats-server (a plain nack would not: it lives only in memory)."""

from __future__ import annotations

import time

import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy

from rebaser_core.embedded import NatsServer
from rebaser_core.testing import wait_for
from rebaser_server.task.handback import hand_back

ACK_WAIT = 30.0


async def test_a_hand_back_survives_a_server_restart(own_server: NatsServer, subject_prefix: str) -> None:
    stream = f"{subject_prefix}_TASKS"
    nc = await nats.connect(own_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(
            name=stream, subjects=[f"{subject_prefix}.t.>"], retention=RetentionPolicy.WORK_QUEUE
        )
        await js.add_consumer(
            stream, ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT)
        )
        await js.publish(f"{subject_prefix}.t.a", b"task")
        sub = await js.pull_subscribe_bind("c", stream)
        [msg] = await sub.fetch(1, timeout=5)
        await hand_back(nc, msg)  # returns once the server has it
    finally:
        await nc.close()

    # Stopped right after, as the embedded server is after its daemon.
    own_server.restart()
    nc = await nats.connect(own_server.url)
    try:
        sub = await nc.jetstream().pull_subscribe_bind("c", stream)
        started = time.monotonic()

        async def redelivered() -> bool:
            try:
                return bool(await sub.fetch(1, timeout=0.5))
            except TimeoutError:
                return False

        await wait_for(redelivered, timeout=ACK_WAIT / 3, message="the task was not handed back")
        assert time.monotonic() - started < ACK_WAIT / 3
    finally:
        await nc.close()
