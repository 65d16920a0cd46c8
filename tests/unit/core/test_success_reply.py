"""The success reply's fast path gives what the general path gives, and leaves everything else to it."""

from __future__ import annotations

import json
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebaser_core import headers as h
from rebaser_core.api import (
    ENQUEUE_UPDATES_RESPONSE,
    ContentType,
    EnqueueUpdatesRequest,
    EnqueueUpdatesResponse,
    ErrorStatus,
    InlineUpdates,
    RefusedStatus,
    SetLiteral,
    SuccessStatus,
    oldest_form,
)
from rebaser_core.api.success_reply import decode_success, encode_success
from rebaser_core.errors import ProtocolError
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk

CODECS = [ContentType.CBOR, ContentType.JSON]


def _request() -> EnqueueUpdatesRequest:
    return EnqueueUpdatesRequest(
        id=RequestId.new(),
        workspace_id=WorkspacePk.new(),
        change_set_id=ChangeSetId.new(),
        updates=InlineUpdates(updates=[SetLiteral(path="/n", value=1)]),
    )


def _reply(request: EnqueueUpdatesRequest, status: Any) -> EnqueueUpdatesResponse:
    return EnqueueUpdatesResponse(
        id=request.id, workspace_id=request.workspace_id, change_set_id=request.change_set_id, status=status
    )


def _general(headers: dict[str, str], body: bytes) -> EnqueueUpdatesResponse | None:
    try:
        return ENQUEUE_UPDATES_RESPONSE.decode(headers, body)
    except ProtocolError:
        return None


@settings(max_examples=200, deadline=None)
@given(
    performed=st.integers(min_value=0, max_value=2**64 - 1),
    address=st.none() | st.text(max_size=80),
    content_type=st.sampled_from(CODECS),
)
def test_a_success_round_trips_as_the_general_path_has_it(
    performed: int, address: str | None, content_type: ContentType
) -> None:
    request = _request()
    response = _reply(request, SuccessStatus(updates_performed=performed, snapshot_address=address))
    general = ENQUEUE_UPDATES_RESPONSE.encode(oldest_form(response), content_type)
    fast = encode_success(response, content_type)
    assert fast == general  # the same headers and the same bytes
    decoded = decode_success(*general, request)
    assert decoded is not None
    assert decoded == ENQUEUE_UPDATES_RESPONSE.decode(*general) == response
    assert decoded.model_fields_set == response.model_fields_set
    assert decoded.status.model_fields_set == {"kind", "updates_performed", "snapshot_address"}
    assert decoded.model_dump() == response.model_dump()


@pytest.mark.parametrize("content_type", CODECS)
@pytest.mark.parametrize(
    "status",
    [
        ErrorStatus(message="boom", retryable=True),
        RefusedStatus(message="no", details={"field": "x"}),
    ],
)
def test_other_statuses_take_the_general_path(status: Any, content_type: ContentType) -> None:
    request = _request()
    response = _reply(request, status)
    assert encode_success(response, content_type) is None
    headers, body = ENQUEUE_UPDATES_RESPONSE.encode(oldest_form(response), content_type)
    assert decode_success(headers, body, request) is None
    assert _general(headers, body) == response


def _success_data(request: EnqueueUpdatesRequest) -> dict[str, Any]:
    return {
        "id": str(request.id),
        "workspace_id": str(request.workspace_id),
        "change_set_id": str(request.change_set_id),
        "status": {"kind": "success", "updates_performed": 1, "snapshot_address": None},
    }


def _headers(content_type: ContentType) -> dict[str, str]:
    return {
        h.CONTENT_TYPE: content_type.value,
        h.MESSAGE_TYPE: ENQUEUE_UPDATES_RESPONSE.name,
        h.MESSAGE_VERSION: "1",
        h.NATS_MSG_ID: "x",
    }


def _body(data: Any, content_type: ContentType) -> bytes:
    if content_type is ContentType.CBOR:
        return bytes(cbor2.dumps(data))
    return json.dumps(data).encode()


def _changes(request: EnqueueUpdatesRequest) -> list[tuple[str, Any]]:
    other = _request()
    return [
        ("another request's id", lambda d: d.update(id=str(other.id))),
        ("another workspace", lambda d: d.update(workspace_id=str(other.workspace_id))),
        ("another change set", lambda d: d.update(change_set_id=str(other.change_set_id))),
        ("a lower-case id", lambda d: d.update(id=str(request.id).lower())),
        ("an extra field", lambda d: d.update(extra=1)),
        ("a missing status", lambda d: d.pop("status")),
        ("an extra status field", lambda d: d["status"].update(more=1)),
        ("a negative count", lambda d: d["status"].update(updates_performed=-1)),
        ("a float count", lambda d: d["status"].update(updates_performed=1.0)),
        ("a boolean count", lambda d: d["status"].update(updates_performed=True)),
        ("a text count", lambda d: d["status"].update(updates_performed="1")),
        ("a numeric address", lambda d: d["status"].update(snapshot_address=5)),
        ("another kind", lambda d: d["status"].update(kind="error")),
        ("a status list", lambda d: d.update(status=[1])),
        ("a huge count", lambda d: d["status"].update(updates_performed=2**64)),
    ]


@pytest.mark.parametrize("content_type", CODECS)
def test_anything_but_the_exact_shape_takes_the_general_path(content_type: ContentType) -> None:
    request = _request()
    for why, change in _changes(request):
        data = _success_data(request)
        change(data)
        try:
            body = _body(data, content_type)
        except (OverflowError, ValueError):
            continue  # not encodable in this codec at all
        assert decode_success(_headers(content_type), body, request) is None, why


@pytest.mark.parametrize("content_type", CODECS)
def test_headers_other_than_ours_take_the_general_path(content_type: ContentType) -> None:
    request = _request()
    body = _body(_success_data(request), content_type)
    assert decode_success(_headers(content_type), body, request) is not None
    for name, value in [
        (h.MESSAGE_TYPE, "SomethingElse"),
        (h.MESSAGE_VERSION, "01"),
        (h.MESSAGE_VERSION, "4"),
        (h.CONTENT_TYPE, "application/cbor; charset=x"),
        ("X-Padding", "x" * (h.MAX_HEADER_BYTES + 1)),
    ]:
        headers = {**_headers(content_type), name: value}
        assert decode_success(headers, body, request) is None, (name, value)
    assert decode_success(None, body, request) is None
    lower = {k.lower(): v for k, v in _headers(content_type).items()}
    assert decode_success(lower, body, request) is None  # the general path matches names case-insensitively


def test_hostile_cbor_takes_the_general_path() -> None:
    request = _request()
    headers = _headers(ContentType.CBOR)
    body = _body(_success_data(request), ContentType.CBOR)
    shared = bytes(cbor2.dumps(cbor2.CBORTag(28, _success_data(request))))
    for hostile in [
        body + b"\x00",  # trailing data
        body[:-1],  # truncated
        shared,  # a tag
        b"\x81" * 2000 + b"\x00",  # too long, and deep
        b"\xff",
    ]:
        assert decode_success(headers, hostile, request) is None
        assert _general(headers, hostile) is None


def test_json_with_a_lone_surrogate_takes_the_general_path() -> None:
    request = _request()
    data = _success_data(request)
    body = json.dumps(data).encode().replace(b'"snapshot_address": null', b'"snapshot_address": "\\ud800"')
    assert decode_success(_headers(ContentType.JSON), body, request) is None
    assert _general(_headers(ContentType.JSON), body) is None
