"""The app contract on a real daemon: a refusal is answered and committed without a dead letter; a request that
applies one change set onto another goes to ``apply_change_set`` with the source's committed state, or is refused;
stored batches reach every app through ``ChangeSet.updates``."""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client as NatsClient

from rebaser_client import RebaserClient, SetLiteral
from rebaser_core.api import EnqueueUpdatesRequest, InlineUpdates, RefusedStatus
from rebaser_core.errors import RefusedError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
from rebaser_server.app import App, Applied, AppState, ChangeSet, Committed
from rebaser_server.apps.counter import CounterApp
from rebaser_server.testing import fast_settings, running_daemon


class Ledger(App):
    """Appends each request's values; ``/refuse`` is refused with the details it carries."""

    def __init__(self) -> None:
        self.merged: list[Committed] = []

    def initial_state(self, change_set: ChangeSet) -> AppState:
        return {"values": []}

    async def apply(self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest) -> Applied:
        values = []
        for update in await change_set.updates(request):
            assert isinstance(update, SetLiteral)
            if update.path == "/refuse":
                raise RefusedError("refused on purpose", update.value)
            values.append(update.value)
        return Applied.success({"values": [*state["values"], *values]}, len(values))

    async def apply_change_set(
        self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest, source: Committed
    ) -> Applied:
        self.merged.append(source)
        return Applied.success(
            {"values": [*state["values"], *source.state["values"]]}, len(source.state["values"])
        )


def _request(wk: WorkspacePk, cs: ChangeSetId, *values: Any, path: str = "/v") -> EnqueueUpdatesRequest:
    updates = [SetLiteral(path=path, value=v) for v in values]
    return EnqueueUpdatesRequest(
        id=RequestId.new(), workspace_id=wk, change_set_id=cs, updates=InlineUpdates(updates=updates)
    )


async def _dead_letters(nc: NatsClient, prefix: str) -> int:
    js = nc.jetstream()
    info = await js.stream_info(fast_settings(prefix).subjects.dead_letter_stream)
    return info.state.messages


async def test_a_refusal_is_answered_committed_and_not_dead_lettered(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), Ledger()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        assert (await client.send(_request(wk, cs, 1), timeout=10)).ok  # type: ignore[union-attr]
        refused_request = _request(wk, cs, {"field": "quantity", "minimum": 1}, path="/refuse")
        reply = await client.send(refused_request, timeout=10)
        assert reply is not None and isinstance(reply.status, RefusedStatus)
        assert reply.status.message == "refused on purpose"
        assert reply.status.details == {"field": "quantity", "minimum": 1}
        assert (await client.send(_request(wk, cs, 2), timeout=10)).ok  # type: ignore[union-attr]

        record = await daemon.store.read(ChangeSet(wk, cs))
        assert record is not None and record.state == {"values": [1, 2]}  # the refusal left the state alone
        assert record.reply_for(refused_request) == reply  # committed: a resend is answered from the record
        again = await client.send(refused_request, timeout=10)
        assert again == reply
        assert record.applied_seq >= 3
        assert daemon.stats.requests_refused == 1
        assert daemon.stats.requests_dead_lettered == 0
        assert await _dead_letters(nc, subject_prefix) == 0


async def test_details_that_are_not_json_are_left_out_and_said_to_be(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    class Odd(Ledger):
        async def apply(
            self, change_set: ChangeSet, state: AppState, request: EnqueueUpdatesRequest
        ) -> Applied:
            raise RefusedError("no", {"a set": {1, 2}})  # type: ignore[dict-item]

    async with running_daemon(nc, fast_settings(subject_prefix), Odd()):
        reply = await client.send(_request(WorkspacePk.new(), ChangeSetId.new(), 1), timeout=10)
        assert reply is not None and isinstance(reply.status, RefusedStatus)
        assert reply.status.details is None and "details left out" in reply.status.message


async def test_one_change_set_applied_onto_another_gets_its_committed_state(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    app = Ledger()
    async with running_daemon(nc, fast_settings(subject_prefix), app):
        wk, mine, theirs = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
        assert (await client.send(_request(wk, theirs, "a", "b"), timeout=10)).ok  # type: ignore[union-attr]
        assert (await client.send(_request(wk, mine, "x"), timeout=10)).ok  # type: ignore[union-attr]
        reply = await client.enqueue_updates_from_change_set_with_reply(wk, mine, theirs, timeout=10)
        assert reply.ok and reply.status.kind == "success" and reply.status.updates_performed == 2
        assert [(c.change_set.change_set_id, c.state) for c in app.merged] == [
            (theirs, {"values": ["a", "b"]})
        ]

        missing = ChangeSetId.new()
        reply = await client.enqueue_updates_from_change_set_with_reply(wk, mine, missing, timeout=10)
        assert isinstance(reply.status, RefusedStatus)
        assert reply.status.message == f"change set {missing} does not exist"
        reply = await client.enqueue_updates_from_change_set_with_reply(wk, mine, mine, timeout=10)
        assert isinstance(reply.status, RefusedStatus)


async def test_an_app_without_apply_change_set_refuses_it_instead_of_doing_nothing(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), CounterApp()) as daemon:
        wk, mine, theirs = WorkspacePk.new(), ChangeSetId.new(), ChangeSetId.new()
        assert (await client.send(_request(wk, theirs, 1), timeout=10)).ok  # type: ignore[union-attr]
        reply = await client.enqueue_updates_from_change_set_with_reply(wk, mine, theirs, timeout=10)
        assert isinstance(reply.status, RefusedStatus)
        assert "does not apply one change set onto another" in reply.status.message
        assert reply.status.details == {"unsupported": "from_change_set_id"}
        assert daemon.stats.requests_dead_lettered == 0


async def test_a_stored_batch_reaches_any_app_through_the_change_set(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), CounterApp()) as daemon:
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        stored = await client.store_batch(wk, [SetLiteral(path=f"/v{i}", value=i) for i in range(300)])
        reply = await client.enqueue_updates_with_reply(wk, cs, stored, timeout=10)
        assert reply.status.kind == "success" and reply.status.updates_performed == 300
        missing = await client.enqueue_updates_with_reply(wk, cs, "0" * 64, timeout=10)
        assert missing.status.kind == "error" and "does not exist" in missing.status.message  # dead-lettered
        record = await daemon.store.read(ChangeSet(wk, cs))
        assert record is not None and record.state == {"requests": 1, "updates": 300}
