"""Admission's wait for a slot (rebaser_server.intake.admission), as pure asyncio: no release is lost between a
pull loop's look and its wait, a shutdown's wake holds for every later wait, and with nothing freed the wait ends
after PRESSURE_CHECK saying so. PRESSURE_CHECK is made an hour where a lost wake-up must show as a test that hangs
until its deadline."""

from __future__ import annotations

import asyncio

import pytest

from rebaser_core.settings import Settings
from rebaser_server.intake import admission
from rebaser_server.intake.admission import Admission


@pytest.fixture
def an_hour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "PRESSURE_CHECK", 3600.0)


async def test_a_start_before_the_wait_is_not_lost(an_hour: None) -> None:
    slots = Admission(Settings())
    slots.taken("cs")
    slots.started("cs")  # between the loop's look (no room) and its wait
    async with asyncio.timeout(10):
        assert await slots.wait()
    waiting = asyncio.ensure_future(slots.wait())  # counted once: the next wait waits
    await asyncio.sleep(0)
    assert not waiting.done()
    slots.started("other")
    async with asyncio.timeout(10):
        assert await waiting


async def test_a_wake_holds_for_every_later_wait(an_hour: None) -> None:
    slots = Admission(Settings())
    slots.wake()
    async with asyncio.timeout(10):
        assert await slots.wait()
        assert await slots.wait()


async def test_with_nothing_freed_the_wait_ends_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "PRESSURE_CHECK", 0.01)
    async with asyncio.timeout(10):
        assert not await Admission(Settings()).wait()
