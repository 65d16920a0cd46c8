"""A stream's subjects past nats-server's page of 100,000 (rebaser_core.nats.listing): nats-py's stream_info reads the
first page only, so the orphan sweep, the lease reaper's hand-back and the intake's rescan, which list subjects,
missed every subject after it."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient
from nats.js import api

from rebaser_core.nats.listing import stream_subjects
from rebaser_core.testing import wait_for

PAGE = 100_000  # nats-server's JSMaxSubjectDetails


async def test_every_subject_is_listed_past_the_first_page(nc: NatsClient, subject_prefix: str) -> None:
    js = nc.jetstream()
    stream = f"{subject_prefix}_LISTING"
    await js.add_stream(
        name=stream,
        subjects=[f"{subject_prefix}.listing.>"],
        storage=api.StorageType.MEMORY,
        max_msgs_per_subject=1,
    )
    try:
        count = PAGE + 250
        for n in range(
            count
        ):  # plain publishes: the stream stores them, nobody waits for each acknowledgement
            await nc.publish(f"{subject_prefix}.listing.s{n:06d}", b"")
        await nc.flush(timeout=30)

        async def stored() -> bool:
            return (await js.stream_info(stream)).state.messages == count

        await wait_for(stored, timeout=60, message="every message stored")
        first_page = (await js.stream_info(stream, subjects_filter=">")).state.subjects or {}
        assert len(first_page) == PAGE  # what the listings read before
        listed = await stream_subjects(js, stream, ">", timeout=30)
        assert len(listed) == count and set(listed.values()) == {1}
        assert f"{subject_prefix}.listing.s{count - 1:06d}" in listed
        # A filter narrower than a page is one page, as before.
        assert list(await stream_subjects(js, stream, f"{subject_prefix}.listing.s000007")) == [
            f"{subject_prefix}.listing.s000007"
        ]
    finally:
        await js.delete_stream(stream)
