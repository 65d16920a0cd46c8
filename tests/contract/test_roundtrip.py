"""Property tests: every message survives both codecs, and every old version upgrades to a current one."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from ulid import ULID

from rebaser_core import headers as h
from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    ENQUEUE_UPDATES_RESPONSE,
    Conflict,
    ConflictsStatus,
    ContentType,
    EnqueueUpdatesRequestV1,
    EnqueueUpdatesRequestV2,
    EnqueueUpdatesRequestV3,
    EnqueueUpdatesResponseV1,
    EnqueueUpdatesResponseV2,
    EnqueueUpdatesResponseV3,
    ErrorDetails,
    ErrorStatus,
    InlineUpdates,
    MessageVersion,
    RefusedStatus,
    Remove,
    SetFunction,
    SetLiteral,
    StoredUpdates,
    SuccessStatus,
    VersionedMessage,
)
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk

# database=None: no example database written into the work tree.
PROPERTY = settings(max_examples=120, deadline=None, database=None)
LIGHT = settings(max_examples=30, deadline=None, database=None)  # properties that need few examples

# -- strategies -------------------------------------------------------------------------------------------------

ulids = st.integers(min_value=0, max_value=2**128 - 1).map(ULID.from_int)
request_ids = ulids.map(RequestId)
workspace_ids = ulids.map(WorkspacePk)
change_set_ids = ulids.map(ChangeSetId)

# Segments of any non-whitespace characters except '/', like the AttributePath pattern ``^(/[^/\s]+)+$``.
paths = st.from_regex(r"(/[^/\s]{1,12}){1,5}", fullmatch=True)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
versions = st.none() | st.text(max_size=16)
addresses = st.text(min_size=1, max_size=64)
event_session_ids = st.none() | st.text(min_size=1, max_size=64)

set_literals = st.builds(SetLiteral, path=paths, value=json_values, expected_version=versions)
set_functions = st.builds(
    SetFunction,
    path=paths,
    function=st.text(min_size=1, max_size=32),
    args=st.lists(paths, max_size=4),
    expected_version=versions,
)
removes = st.builds(Remove, path=paths, expected_version=versions)
updates = st.one_of(set_literals, set_functions, removes)
updates_kinds = st.one_of(
    st.builds(InlineUpdates, updates=st.lists(updates, max_size=6)),
    st.builds(StoredUpdates, address=addresses),
)

requests_v1 = st.builds(
    EnqueueUpdatesRequestV1,
    id=request_ids,
    workspace_id=workspace_ids,
    change_set_id=change_set_ids,
    updates_address=addresses,
    from_change_set_id=st.none() | change_set_ids,
)
requests_v2 = st.builds(
    EnqueueUpdatesRequestV2,
    id=request_ids,
    workspace_id=workspace_ids,
    change_set_id=change_set_ids,
    updates_address=addresses,
    from_change_set_id=st.none() | change_set_ids,
    event_session_id=event_session_ids,
)
requests_v3 = st.builds(
    EnqueueUpdatesRequestV3,
    id=request_ids,
    workspace_id=workspace_ids,
    change_set_id=change_set_ids,
    updates=updates_kinds,
    from_change_set_id=st.none() | change_set_ids,
    event_session_id=event_session_ids,
)

conflicts = st.builds(
    Conflict,
    path=st.one_of(paths, st.text(max_size=20)),
    expected_version=versions,
    actual_version=versions,
    message=st.text(max_size=40),
)
statuses = st.one_of(
    st.builds(
        SuccessStatus,
        updates_performed=st.integers(min_value=0, max_value=2**63 - 1),
        snapshot_address=st.none() | st.text(max_size=64),
    ),
    st.builds(ConflictsStatus, conflicts=st.lists(conflicts, max_size=4)),
    st.builds(ErrorStatus, message=st.text(max_size=80), retryable=st.booleans()),
)
json_scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text(max_size=12)
)
statuses_v2 = statuses | st.builds(
    RefusedStatus,
    message=st.text(max_size=80),
    details=st.none()
    | st.dictionaries(st.text(max_size=8), json_scalars | st.lists(json_scalars, max_size=3), max_size=4),
)
responses_v1 = st.builds(
    EnqueueUpdatesResponseV1,
    id=request_ids,
    workspace_id=workspace_ids,
    change_set_id=change_set_ids,
    status=statuses,
)
responses_v2 = st.builds(
    EnqueueUpdatesResponseV2,
    id=request_ids,
    workspace_id=workspace_ids,
    change_set_id=change_set_ids,
    status=statuses_v2,
)

statuses_v3 = statuses_v2 | st.builds(
    ErrorStatus,
    message=st.text(max_size=80),
    retryable=st.booleans(),
    details=st.builds(
        ErrorDetails, error_class=st.text(max_size=20), raised_at=st.none() | st.text(max_size=40)
    ),
)
responses_v3 = st.builds(
    EnqueueUpdatesResponseV3,
    id=request_ids,
    workspace_id=workspace_ids,
    change_set_id=change_set_ids,
    status=statuses_v3,
)

current_messages: st.SearchStrategy[tuple[VersionedMessage[Any], MessageVersion]] = st.one_of(
    requests_v3.map(lambda m: (ENQUEUE_UPDATES_REQUEST, m)),
    responses_v3.map(lambda m: (ENQUEUE_UPDATES_RESPONSE, m)),
)


# -- helpers ----------------------------------------------------------------------------------------------------


def _roundtrip(registry: VersionedMessage[Any], message: MessageVersion, content_type: ContentType) -> None:
    headers, body = registry.encode(message, content_type)
    assert headers[h.CONTENT_TYPE] == content_type.value
    assert headers[h.MESSAGE_TYPE] == registry.name
    assert headers[h.MESSAGE_VERSION] == str(message.VERSION)
    assert headers[h.NATS_MSG_ID] == str(message.id)

    negotiated = registry.negotiate(headers)
    decoded = registry.decode_version(body, negotiated)
    assert type(decoded) is type(message)
    assert decoded == message
    # Byte-stable: the decoded message encodes to the very same bytes (catches int/float or order drift,
    # which == alone would not see).
    assert registry.encode(decoded, content_type) == (headers, body)


# -- current messages -------------------------------------------------------------------------------------------


@PROPERTY
@given(current_messages)
def test_current_messages_roundtrip_through_both_codecs(
    case: tuple[VersionedMessage[Any], MessageVersion],
) -> None:
    registry, message = case
    assert type(message) is registry.current
    for content_type in ContentType:
        _roundtrip(registry, message, content_type)
        headers, body = registry.encode(message, content_type)
        assert registry.decode(headers, body) == message


@PROPERTY
@given(current_messages)
def test_cbor_to_json_and_back_preserves_equality(case: tuple[VersionedMessage[Any], MessageVersion]) -> None:
    registry, message = case
    cbor_headers, cbor_body = registry.encode(message, ContentType.CBOR)
    from_cbor = registry.decode(cbor_headers, cbor_body)

    json_headers, json_body = registry.encode(from_cbor, ContentType.JSON)
    assert json_body == registry.encode(message, ContentType.JSON)[1]
    from_json = registry.decode(json_headers, json_body)
    assert from_json == from_cbor == message

    back_headers, back_body = registry.encode(from_json, ContentType.CBOR)
    assert (back_headers, back_body) == (cbor_headers, cbor_body)


@LIGHT
@given(current_messages)
def test_json_mode_dump_validates_back_to_the_same_message(
    case: tuple[VersionedMessage[Any], MessageVersion],
) -> None:
    registry, message = case
    assert registry.current.model_validate(message.model_dump(mode="json")) == message


# -- older versions ---------------------------------------------------------------------------------------------


@PROPERTY
@given(st.one_of(requests_v1, requests_v2))
def test_older_request_versions_roundtrip_and_upgrade_to_the_current_one(
    message: EnqueueUpdatesRequestV1 | EnqueueUpdatesRequestV2,
) -> None:
    registry = ENQUEUE_UPDATES_REQUEST
    for content_type in ContentType:
        _roundtrip(registry, message, content_type)
        headers, body = registry.encode(message, content_type)
        current = registry.decode(headers, body)

        assert type(current) is EnqueueUpdatesRequestV3
        assert current == registry.upgrade(message)
        assert current.id == message.id
        assert current.workspace_id == message.workspace_id
        assert current.change_set_id == message.change_set_id
        assert current.from_change_set_id == message.from_change_set_id
        assert current.updates == StoredUpdates(address=message.updates_address)
        expected_session = message.event_session_id if isinstance(message, EnqueueUpdatesRequestV2) else None
        assert current.event_session_id == expected_session
        # The upgraded message is itself a valid current message on the wire.
        _roundtrip(registry, current, content_type)


@LIGHT
@given(requests_v1)
def test_upgrade_is_step_by_step(message: EnqueueUpdatesRequestV1) -> None:
    v2 = message.upgrade()
    assert type(v2) is EnqueueUpdatesRequestV2
    assert v2.event_session_id is None
    assert v2.upgrade() == ENQUEUE_UPDATES_REQUEST.upgrade(message)


@LIGHT
@given(requests_v3)
def test_current_version_upgrades_to_itself(message: EnqueueUpdatesRequestV3) -> None:
    assert ENQUEUE_UPDATES_REQUEST.upgrade(message) is message


@PROPERTY
@given(responses_v2)
def test_version_2_replies_roundtrip_and_upgrade_to_the_current_version(
    message: EnqueueUpdatesResponseV2,
) -> None:
    for content_type in ContentType:
        _roundtrip(ENQUEUE_UPDATES_RESPONSE, message, content_type)
        headers, body = ENQUEUE_UPDATES_RESPONSE.encode(message, content_type)
        upgraded = ENQUEUE_UPDATES_RESPONSE.decode(headers, body)
        assert type(upgraded) is EnqueueUpdatesResponseV3
        assert upgraded.model_dump() == message.model_dump()


@PROPERTY
@given(responses_v1)
def test_version_1_replies_roundtrip_and_upgrade_to_the_current_version(
    message: EnqueueUpdatesResponseV1,
) -> None:
    for content_type in ContentType:
        _roundtrip(ENQUEUE_UPDATES_RESPONSE, message, content_type)
        headers, body = ENQUEUE_UPDATES_RESPONSE.encode(message, content_type)
        upgraded = ENQUEUE_UPDATES_RESPONSE.decode(headers, body)
        assert type(upgraded) is EnqueueUpdatesResponseV3
        assert upgraded.model_dump() == message.model_dump()
