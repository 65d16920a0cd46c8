"""A flood of generated hostile messages (bodies, headers, subjects, reply inboxes) at a live daemon.

Every one must end answered or dead-lettered, a canary change set of another workspace must be served throughout
with bounded latency, and no other change set may change. The CI version throws a few hundred; ``make chaos`` (the
``slow`` mark) throws 10,000.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import cbor2
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core import headers as h
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_core.nats.tasks import publish_task
from rebaser_core.settings import Settings
from rebaser_core.testing import wait_for
from rebaser_server.app import ChangeSet
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp, applied

GOOD_HEADERS = {
    h.MESSAGE_TYPE: "EnqueueUpdatesRequest",
    h.MESSAGE_VERSION: "3",
    h.CONTENT_TYPE: "application/cbor",
}


def _bomb(depth: int) -> bytes:
    """CBOR value-sharing bomb: each level an array holding the level below twice (2^depth nodes when expanded)."""
    body = b"\x00"
    for _ in range(depth):
        body = b"\xd8\x1c\x82" + body + b"\xd8\x1d\x00"  # shareable [x, shared-ref 0]
    return body


def _body(rng: random.Random, wk: WorkspacePk, cs: ChangeSetId, rid: str) -> tuple[bytes, str]:
    """A hostile body, and the content type to announce for it."""
    good = {
        "id": rid,
        "workspace_id": str(wk),
        "change_set_id": str(cs),
        "updates": {"kind": "inline", "updates": []},
    }
    kind = rng.randrange(9)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 300)), "application/cbor"
    if kind == 1:
        return _bomb(rng.randrange(20, 48)), "application/cbor"
    if kind == 2:
        return b"[" * rng.randrange(100, 5000), "application/json"
    if kind == 3:  # another workspace's ids in the body
        return bytes(cbor2.dumps({**good, "workspace_id": str(WorkspacePk.new())})), "application/cbor"
    if kind == 4:  # a body id that is not the Nats-Msg-Id
        return bytes(cbor2.dumps({**good, "id": str(RequestId.new())})), "application/cbor"
    if kind == 5:
        return json.dumps(
            {**good, "updates": {"kind": "stored", "address": "0" * 64}}
        ).encode(), "application/json"
    if kind == 6:
        return json.dumps({**good, "updates": "x" * rng.randrange(1, 2000)}).encode(), "application/json"
    if kind == 7:
        return b'{"id": NaN}', "application/json"
    return bytes(cbor2.dumps([1, 2, {"a": b"bytes"}])), rng.choice(
        ["application/cbor", "text/xml", "", "a" * 300]
    )


def _headers(rng: random.Random, rid: str, content_type: str, inbox: str | None) -> dict[str, str]:
    headers = {**GOOD_HEADERS, h.NATS_MSG_ID: rid, h.CONTENT_TYPE: content_type}
    kind = rng.randrange(6)
    if kind == 0:
        headers[h.MESSAGE_VERSION] = rng.choice(["0", "-1", "99", "x", "1" * 40])
    elif kind == 1:
        del headers[h.MESSAGE_TYPE]
    elif kind == 2:
        headers["X-Junk"] = "j" * rng.randrange(1000, 20_000)
    elif kind == 3:
        headers[h.MESSAGE_TYPE] = rng.choice(["GetChangeSetRequest", "x" * 500])
    if inbox is not None:
        headers[h.REPLY_INBOX] = inbox
    return headers


def _hostile_inbox(rng: random.Random, settings: Settings, victim: tuple[WorkspacePk, ChangeSetId]) -> str:
    subjects = settings.subjects
    return rng.choice(
        [
            f"$KV.{subjects.change_sets_bucket}.{victim[0]}.{victim[1]}",
            f"$O.{subjects.snapshots_bucket}.M.x",
            subjects.requests(*victim),
            "_INBOX.*",
            "_INBOX.>",
            "_INBOX." + "a" * 300,
            "_INBOX..x",
            "not-an-inbox",
        ]
    )


async def _flood(nc: NatsClient, client: RebaserClient, subject_prefix: str, count: int) -> None:
    rng = random.Random(20261130 + count)
    # Every hostile message leaves a dead letter, and the test counts them: room for all of them (file storage, so
    # nothing is reserved from the shared test server's memory), and no share per workspace or change set (those
    # bounds have tests of their own: test_dead_letter_shares.py).
    settings = fast_settings(
        subject_prefix,
        storage="file",
        dead_letter_max_bytes=256 * 1024 * 1024,
        dead_letter_max_per_change_set=-1,
        dead_letter_max_per_workspace=-1,
    )
    subjects = settings.subjects
    js = nc.jetstream()
    async with running_daemon(nc, settings, RecordingApp()) as daemon:
        victim = (WorkspacePk.new(), ChangeSetId.new())
        canary = (WorkspacePk.new(), ChangeSetId.new())
        bystander = (WorkspacePk.new(), ChangeSetId.new())
        assert (await client.enqueue_updates_with_reply(*bystander, [SetLiteral(path="/n", value=1)])).ok
        before = await daemon.store.read(ChangeSet(*bystander))

        replies: list[Msg] = []
        reply_prefix = nc.new_inbox()

        async def on_reply(msg: Msg) -> None:
            replies.append(msg)

        reply_sub = await nc.subscribe(f"{reply_prefix}.*", cb=on_reply)

        canary_latencies: list[float] = []
        flooding = asyncio.Event()
        flooding.set()

        async def canary_traffic() -> None:
            n = 0
            while flooding.is_set():
                started = time.monotonic()
                response = await client.enqueue_updates_with_reply(
                    *canary, [SetLiteral(path="/n", value=n)], timeout=30
                )
                assert response.ok
                canary_latencies.append(time.monotonic() - started)
                n += 1

        canary_task = asyncio.create_task(canary_traffic())
        expected_replies = 0
        on_victim = 0
        malformed = 0
        for i in range(count):
            rid = str(RequestId.new())
            body, content_type = _body(rng, *victim, rid)
            roll = rng.random()
            if roll < 0.05:
                # A malformed subject (the stream's filter takes any two tokens): the orphan sweep removes it.
                token = rng.choice(["*", "%2A", "not-a-ulid", "x" * 200, str(RequestId.new()).lower()])
                junk = subjects.requests_all.removesuffix(">") + f"{token}.{victim[1]}"
                await js.publish(junk, body)
                malformed += 1
                continue
            if roll < 0.35:
                inbox: str | None = f"{reply_prefix}.{i}"
                expected_replies += 1
            elif roll < 0.6:
                inbox = _hostile_inbox(rng, settings, victim)
            else:
                inbox = None
            await js.publish(
                subjects.requests(*victim), body, headers=_headers(rng, rid, content_type, inbox)
            )
            on_victim += 1
            if i % 50 == 0:
                await publish_task(nc, subjects.task(*victim))
        await publish_task(nc, subjects.task(*victim))

        async def victim_drained() -> bool:
            info = await js.stream_info(subjects.requests_stream, subjects_filter=subjects.requests(*victim))
            return not (info.state.subjects or {})

        await wait_for(
            victim_drained, timeout=max(60, count / 20), interval=0.5, message="every hostile message handled"
        )

        async def dead_lettered(subject: str, wanted: int) -> bool:
            info = await js.stream_info(subjects.dead_letter_stream, subjects_filter=subject)
            return (info.state.subjects or {}).get(subject, 0) >= wanted

        async def victim_accounted() -> bool:
            # A generated message may be well-formed after all (a stored batch the test app accepts): then it is
            # applied and answered like any request. Every other one is dead-lettered.
            ok = len(await applied(daemon.store, *victim))
            return await dead_lettered(subjects.dead_letter(*victim), on_victim - ok)

        await wait_for(
            victim_accounted, timeout=30, message=f"all {on_victim} hostile requests dead-lettered or applied"
        )
        if malformed:
            await wait_for(
                lambda: dead_lettered(subjects.dead_letter_malformed, malformed),
                timeout=60,
                interval=0.5,
                message=f"all {malformed} requests on malformed subjects dead-lettered",
            )
        await wait_for(
            lambda: len(replies) >= expected_replies, timeout=30, message="every reply with an inbox"
        )
        flooding.clear()
        await canary_task
        await reply_sub.unsubscribe()

        after = await daemon.store.read(ChangeSet(*bystander))
        assert before is not None and after is not None and after.state == before.state
        assert canary_latencies, "the canary was served"
        print(
            f"\nhostile flood: {count} messages ({on_victim} requests, {malformed} malformed subjects), "
            f"{len(replies)} error replies, canary: {len(canary_latencies)} requests, "
            f"slowest {max(canary_latencies):.2f}s"
        )
        # Bounded: a stalled daemon would show tens of seconds here (the flood takes many seconds to handle).
        assert max(canary_latencies) < 10


async def test_a_flood_of_hostile_messages_smoke(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    await _flood(nc, client, subject_prefix, 300)


@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_a_flood_of_10000_hostile_messages(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    await _flood(nc, client, subject_prefix, 10_000)
