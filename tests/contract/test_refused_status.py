"""The ``refused`` status (EnqueueUpdatesResponse v2): bounded, and sent only when needed, so a client that knows
only version 1 reads every other reply."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rebaser_core.api import (
    ENQUEUE_UPDATES_RESPONSE,
    GET_REPLY_RESPONSE,
    ContentType,
    EnqueueUpdatesResponse,
    EnqueueUpdatesResponseV1,
    ErrorStatus,
    GetReplyResponse,
    RefusedStatus,
    SuccessStatus,
    VersionedMessage,
    oldest_form,
    oldest_reply_form,
)
from rebaser_core.api.change_set_queries import GetReplyResponseV1
from rebaser_core.api.enqueue_updates_response import MAX_DETAILS_BYTES, bounded_status
from rebaser_core.errors import UnsupportedMessageVersion
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk

# What a client of the version before refusals knows.
V1_ONLY = VersionedMessage("EnqueueUpdatesResponse", (EnqueueUpdatesResponseV1,), EnqueueUpdatesResponseV1)
V1_REPLY_ONLY = VersionedMessage("GetReplyResponse", (GetReplyResponseV1,), GetReplyResponseV1)


def _response(status: object) -> EnqueueUpdatesResponse:
    return EnqueueUpdatesResponse(
        id=RequestId.new(), workspace_id=WorkspacePk.new(), change_set_id=ChangeSetId.new(), status=status
    )


@pytest.mark.parametrize("content_type", list(ContentType))
@pytest.mark.parametrize(
    "status",
    [SuccessStatus(updates_performed=2), ErrorStatus(message="boom", retryable=False)],
    ids=["success", "error"],
)
def test_every_reply_but_a_refusal_is_written_as_version_1(content_type: ContentType, status: object) -> None:
    response = _response(status)
    headers, body = ENQUEUE_UPDATES_RESPONSE.encode(oldest_form(response), content_type)
    assert headers["X-MESSAGE-VERSION"] == "1"
    assert V1_ONLY.decode(headers, body).status == status  # an old client reads it
    assert ENQUEUE_UPDATES_RESPONSE.decode(headers, body) == response  # a new one too


@pytest.mark.parametrize("content_type", list(ContentType))
def test_a_refusal_is_version_2_and_round_trips_with_its_details(content_type: ContentType) -> None:
    status = RefusedStatus(
        message="quantity must be at least 1", details={"field": "quantity", "min": [1, None]}
    )
    response = _response(status)
    headers, body = ENQUEUE_UPDATES_RESPONSE.encode(oldest_form(response), content_type)
    assert headers["X-MESSAGE-VERSION"] == "2"
    assert ENQUEUE_UPDATES_RESPONSE.decode(headers, body) == response
    with pytest.raises(
        UnsupportedMessageVersion
    ):  # an old client says so from the headers, it does not misread
        V1_ONLY.decode(headers, body)


def test_the_recorded_reply_query_is_version_1_unless_it_holds_a_refusal() -> None:
    ids = {"id": RequestId.new(), "workspace_id": WorkspacePk.new(), "change_set_id": ChangeSetId.new()}
    found = GetReplyResponse(
        **ids, request_id=RequestId.new(), found=True, status=SuccessStatus(updates_performed=1)
    )
    headers, body = GET_REPLY_RESPONSE.encode(oldest_reply_form(found))
    assert headers["X-MESSAGE-VERSION"] == "1"
    assert V1_REPLY_ONLY.decode(headers, body).status == found.status
    assert GET_REPLY_RESPONSE.decode(headers, body) == found
    refused = found.model_copy(update={"status": RefusedStatus(message="no")})
    headers, body = GET_REPLY_RESPONSE.encode(oldest_reply_form(refused))
    assert headers["X-MESSAGE-VERSION"] == "2"
    assert GET_REPLY_RESPONSE.decode(headers, body) == refused


def test_details_are_bounded_and_json() -> None:
    with pytest.raises(ValidationError):
        RefusedStatus(message="x", details={"blob": "a" * MAX_DETAILS_BYTES})
    with pytest.raises(ValidationError):
        RefusedStatus.model_validate({"message": "x", "details": ["not", "an", "object"]})
    assert RefusedStatus(message="é" * 5000).message.endswith("…")  # the message is cut like an error's


def test_bounding_a_refusal_drops_its_details_before_cutting_its_message() -> None:
    status = RefusedStatus(message="quantity must be at least 1", details={"blob": "a" * 3000})
    bounded = bounded_status(status, 512)
    assert isinstance(bounded, RefusedStatus)
    assert bounded.details is None
    assert bounded.message == status.message
    assert bounded_status(RefusedStatus(message="short", details={"a": 1}), 512) == RefusedStatus(
        message="short", details={"a": 1}
    )
