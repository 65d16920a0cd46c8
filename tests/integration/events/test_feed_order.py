"""The stream holds one change set's events in ``seq`` order, whatever fails: an event's publication that never
reaches the server, or whose acknowledgement is lost, must not let a later event be stored before it (a follower
would then raise ``EventsLost`` on the later one and drop the earlier one as already seen), nor be stored twice.

The fault is made on the daemon's own connection (the server is real): the first publication carrying durable
event 2 is dropped on its way, or delivered with its acknowledgement sent nowhere."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import cbor2
import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.apps import RecordingApp
from tests.support.events import check_feed, next_durable, stored_events

_original_publish = NatsClient.publish


def _durable_seq(payload: bytes) -> int | None:
    try:
        event = cbor2.loads(payload)
    except Exception:
        return None
    return event.get("seq") if isinstance(event, dict) and event.get("durable") else None


@pytest.fixture
def event_fault(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """``fault["how"]`` = "lost" (dropped on its way) or "unanswered" (stored, its acknowledgement sent nowhere),
    for the first publication carrying durable event ``fault["seq"]`` on ``fault["subject"]``."""
    fault: dict[str, Any] = {"how": None, "seq": 2, "subject": None, "struck": 0}

    async def publish(
        self: NatsClient, subject: str, payload: bytes = b"", reply: str = "", **kw: Any
    ) -> None:
        if (
            fault["how"] is not None
            and subject == fault["subject"]
            and not fault["struck"]
            and _durable_seq(payload) == fault["seq"]
        ):
            fault["struck"] += 1
            if fault["how"] == "lost":
                return
            reply = "nowhere." + subject  # stored, and nobody hears the acknowledgement
        await _original_publish(self, subject, payload, reply=reply, **kw)

    monkeypatch.setattr(NatsClient, "publish", publish)
    yield fault


@pytest.mark.parametrize("how", ["lost", "unanswered"])
async def test_a_failed_publication_is_stored_before_the_events_after_it(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, event_fault: dict[str, Any], how: str
) -> None:
    settings = fast_settings(subject_prefix, events=True, nats_timeout=1.0)
    wk, cs = WorkspacePk.new(), ChangeSetId.new()
    event_fault.update(how=how, subject=settings.subjects.events(wk, cs))
    count = 12
    async with running_daemon(nc, settings, RecordingApp()):
        async with client.watch(wk, cs, since=0, feed="stream") as feed:
            await feed.start()
            sent = [
                str((await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=n)])).id)
                for n in range(count)
            ]
            # A follower from the start sees every event once, in order, with no gap (EventsLost would raise).
            events = await next_durable(feed, count, timeout=30)
        assert [e.seq for e in events] == list(range(1, count + 1))
        assert [str(e.request_id) for e in events] == sent
        stored = await stored_events(nc.jetstream(), settings, wk, cs)
    assert event_fault["struck"] == 1
    assert check_feed(stored, sent) == []
    assert [e.seq for e in stored if e.durable] == list(range(1, count + 1))
