"""What a client in another language meets first, sent with raw nats-py publishes against a live daemon: header names
in any letter case, the ``Nats-Msg-Id`` rule, unknown functions, both batch-address forms, error-message prefixes."""

from __future__ import annotations

import json

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_client import ChangeSetId, RebaserClient, SetFunction, SetLiteral, WorkspacePk
from rebaser_core import headers as h
from rebaser_core.api import ENQUEUE_UPDATES_REQUEST, ContentType, EnqueueUpdatesRequest, InlineUpdates
from rebaser_core.ids import RequestId
from rebaser_core.nats.tasks import publish_task
from rebaser_core.settings import Settings
from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.testing import fast_settings, running_daemon
from tests.support.hostile_wire import dead_letter_of


def _request(wk: WorkspacePk, cs: ChangeSetId, *updates: object) -> EnqueueUpdatesRequest:
    return EnqueueUpdatesRequest(
        id=RequestId.new(), workspace_id=wk, change_set_id=cs, updates=InlineUpdates(updates=list(updates))
    )


async def _send(
    nc: NatsClient, settings: Settings, request: EnqueueUpdatesRequest, headers: dict[str, str], body: bytes
) -> tuple[dict[str, str], bytes]:
    """Publish hand-made headers and body as a JetStream publish plus the task; return the reply's headers and body.
    The reply inbox is whatever ``headers`` name (in any case); it is subscribed here first."""
    inbox = next(v for k, v in headers.items() if k.lower() == "x-reply-inbox")
    sub = await nc.subscribe(inbox, max_msgs=1)
    wk, cs = request.workspace_id, request.change_set_id
    ack = await nc.request(settings.subjects.requests(wk, cs), body, headers=headers, timeout=10)
    assert json.loads(ack.data)["stream"] == settings.subjects.requests_stream, ack.data
    await publish_task(nc, settings.subjects.task(wk, cs))
    reply = await sub.next_msg(timeout=20)
    return dict(reply.headers or {}), reply.data


def _json_headers(request: EnqueueUpdatesRequest, inbox: str) -> tuple[dict[str, str], bytes]:
    headers, body = ENQUEUE_UPDATES_REQUEST.encode(request, ContentType.JSON, reply_inbox=inbox)
    return headers, body


@pytest.mark.parametrize(
    "spell",
    [str.lower, lambda name: "-".join(part.capitalize() for part in name.split("-")), str.upper],
    ids=["lower", "canonical", "upper"],
)
async def test_header_names_in_any_case_behave_like_the_documented_ones(
    nc: NatsClient, subject_prefix: str, spell: object
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, SnapshotApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        request = _request(wk, cs, SetLiteral(path="/a", value=1))
        headers, body = _json_headers(request, f"{nc.new_inbox()}.{request.id}")
        respelled = {spell(k): v for k, v in headers.items()}  # type: ignore[operator]
        reply_headers, reply_body = await _send(nc, settings, request, respelled, body)
        # Answered at the lower-case inbox, in the request's content type (JSON), not the CBOR default.
        assert reply_headers[h.CONTENT_TYPE] == "application/json"
        reply = json.loads(reply_body)
        assert reply["id"] == str(request.id) and reply["status"]["kind"] == "success", reply


async def test_a_query_with_lower_case_headers_is_answered_in_its_content_type(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, SnapshotApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        assert (await client.enqueue_updates_with_reply(wk, cs, [SetLiteral(path="/a", value=1)])).ok
        rid = str(RequestId.new())
        query = {"id": rid, "workspace_id": str(wk), "change_set_id": str(cs), "path": "/a"}
        headers = {
            "x-content-type": "application/json",
            "x-message-type": "GetChangeSetRequest",
            "x-message-version": "1",
        }
        reply = await nc.request(
            settings.subjects.api("get", wk, cs), json.dumps(query).encode(), headers=headers, timeout=10
        )
        assert reply.headers is not None and reply.headers[h.CONTENT_TYPE] == "application/json"
        assert json.loads(reply.data)["values"] == {"/a": 1}


@pytest.mark.parametrize("msg_id", [None, "other", "lower"], ids=["missing", "different", "lower-case"])
async def test_nats_msg_id_must_be_the_body_id(
    nc: NatsClient, subject_prefix: str, msg_id: str | None
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, SnapshotApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        request = _request(wk, cs, SetLiteral(path="/a", value=1))
        headers, body = _json_headers(request, f"{nc.new_inbox()}.{request.id}")
        del headers[h.NATS_MSG_ID]
        if msg_id == "other":
            headers[h.NATS_MSG_ID] = str(RequestId.new())
        elif msg_id == "lower":
            headers[h.NATS_MSG_ID] = str(request.id).lower()  # the same id: accepted
        _reply_headers, reply_body = await _send(nc, settings, request, headers, body)
        status = json.loads(reply_body)["status"]
        if msg_id == "lower":
            assert status["kind"] == "success", status
            return
        expected = "MissingHeader: " if msg_id is None else "DecodeError: "
        assert status["kind"] == "error" and status["message"].startswith(expected), status
        letter = await dead_letter_of(nc, settings, wk, cs)
        assert letter.headers is not None and "Nats-Msg-Id" in letter.headers[h.DEAD_LETTER_REASON]


async def test_an_unknown_function_is_an_error_reply_naming_the_known_ones(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    async with running_daemon(nc, settings, SnapshotApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        reply = await client.enqueue_updates_with_reply(
            wk, cs, [SetLiteral(path="/a", value=1), SetFunction(path="/x", function="nosuch", args=["/a"])]
        )
        assert reply.status.kind == "error"
        assert reply.status.message.startswith("UnprocessableError: unknown function 'nosuch'; known: ")
        assert "concat" in reply.status.message
        state = await client.get_change_set(wk, cs)
        assert "/a" not in state.values  # the whole batch was refused


async def test_registered_functions_are_accepted(
    nc: NatsClient, client: RebaserClient, subject_prefix: str
) -> None:
    app = SnapshotApp()
    app.register_function("upper", lambda args: str(args[0]).upper())
    async with running_daemon(nc, fast_settings(subject_prefix), app):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        reply = await client.enqueue_updates_with_reply(
            wk, cs, [SetLiteral(path="/a", value="x"), SetFunction(path="/b", function="upper", args=["/a"])]
        )
        assert reply.ok, reply


@pytest.mark.parametrize("form", ["hex", "sha256:hex"])
async def test_stored_batch_addresses_in_both_forms(
    nc: NatsClient, client: RebaserClient, subject_prefix: str, form: str
) -> None:
    async with running_daemon(nc, fast_settings(subject_prefix), SnapshotApp()):
        wk, cs = WorkspacePk.new(), ChangeSetId.new()
        stored = await client.store_batch(wk, [SetLiteral(path="/a", value="zürich")])
        address = stored.address if form == "hex" else f"sha256:{stored.address}"
        reply = await client.enqueue_updates_with_reply(wk, cs, address)
        assert reply.ok, reply
        missing = await client.enqueue_updates_with_reply(wk, ChangeSetId.new(), "sha256:" + "0" * 64)
        assert missing.status.kind == "error"
        assert missing.status.message.startswith("UnprocessableError: stored batch"), missing.status
