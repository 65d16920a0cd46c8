"""ColdStart (rebaser_server/changeset/cold_start.py): pure asyncio, no server."""

from __future__ import annotations

import asyncio

from rebaser_server.changeset.cold_start import ColdStart


async def test_closing_while_the_queued_read_is_still_under_way_waits_for_its_cancellation() -> None:
    # The acquire failed before the read of the last request answered: close cancels the read. A task's cancel only
    # asks, so reading its outcome at once raised InvalidStateError (seen under load: "task failed").
    read = asyncio.get_running_loop().create_future()
    created: list[int] = []

    async def create() -> int:
        created.append(1)
        return 0

    cold = ColdStart(read, create)
    await asyncio.sleep(0)  # the read is under way
    await cold.close()
    assert cold.has_work().cancelled() and created == []


async def test_a_queued_request_makes_the_consumer_and_close_waits_for_it() -> None:
    read = asyncio.get_running_loop().create_future()
    made = asyncio.Event()

    async def create() -> int:
        made.set()
        return 3

    cold = ColdStart(read, create)
    read.set_result(object())
    assert await cold.has_work()
    await asyncio.wait_for(made.wait(), 5)
    await cold.close()
    assert cold.consumer().result() == 3
