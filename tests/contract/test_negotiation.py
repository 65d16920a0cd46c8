"""Garbage in, typed errors out: a receiver never fails with anything but a ``ProtocolError``.

Headers are checked first and alone: an unsupported content type, message type or version is refused with its own
error before the body is looked at, so a peer learns *which* header it got wrong.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import cbor2
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rebaser_core import headers as h
from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    ENQUEUE_UPDATES_RESPONSE,
    ContentType,
    EnqueueUpdatesRequestV1,
    EnqueueUpdatesRequestV2,
    EnqueueUpdatesRequestV3,
    EnqueueUpdatesResponseV1,
    ErrorStatus,
    InlineUpdates,
    MessageVersion,
    Remove,
    SetFunction,
    SetLiteral,
    StoredUpdates,
    SuccessStatus,
    VersionedMessage,
)
from rebaser_core.api import versioned as versioned_module
from rebaser_core.errors import (
    DecodeError,
    InvalidId,
    MissingHeader,
    ProtocolError,
    RebaserError,
    UnsupportedContentType,
    UnsupportedMessageType,
    UnsupportedMessageVersion,
)
from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk

FUZZ = settings(max_examples=150, deadline=None, database=None)

REQUEST = ENQUEUE_UPDATES_REQUEST
RESPONSE = ENQUEUE_UPDATES_RESPONSE
REGISTRIES: list[VersionedMessage[Any]] = [REQUEST, RESPONSE]

WS = WorkspacePk("01JAW0Q7NB2K5Z8R4V6X9C3D1E")
CS = ChangeSetId("01JAW0Q8F3T6M9P2S5V8Y1B4C7")
RID = RequestId("01JAW0QC8E0G2J4M6P8S0V2X4Z")
GARBAGE = b"\xff\x00 not a message \x9b\xde\xad"

SAMPLES: list[tuple[VersionedMessage[Any], MessageVersion]] = [
    (
        REQUEST,
        EnqueueUpdatesRequestV1(
            id=RID, workspace_id=WS, change_set_id=CS, updates_address="a", from_change_set_id=CS
        ),
    ),
    (
        REQUEST,
        EnqueueUpdatesRequestV2(
            id=RID,
            workspace_id=WS,
            change_set_id=CS,
            updates_address="a",
            event_session_id="s",
            from_change_set_id=CS,
        ),
    ),
    (
        REQUEST,
        EnqueueUpdatesRequestV3(
            id=RID,
            workspace_id=WS,
            change_set_id=CS,
            updates=InlineUpdates(
                updates=[
                    SetLiteral(path="/a/b", value={"k": [1, 2.5, "x", None, True]}),
                    SetFunction(path="/c", function="f", args=["/a/b"], expected_version="1"),
                    Remove(path="/d", expected_version="2"),
                ]
            ),
            event_session_id="s",
        ),
    ),
    (
        REQUEST,
        EnqueueUpdatesRequestV3(
            id=RID, workspace_id=WS, change_set_id=CS, updates=StoredUpdates(address="a")
        ),
    ),
    (
        RESPONSE,
        EnqueueUpdatesResponseV1(
            id=RID, workspace_id=WS, change_set_id=CS, status=SuccessStatus(updates_performed=3)
        ),
    ),
    (
        RESPONSE,
        EnqueueUpdatesResponseV1(
            id=RID, workspace_id=WS, change_set_id=CS, status=ErrorStatus(message="boom")
        ),
    ),
]
SAMPLE_IDS = [f"{type(m).__name__}-{i}" for i, (_, m) in enumerate(SAMPLES)]


def _headers(
    registry: VersionedMessage[Any], content_type: ContentType, version: int | None = None
) -> dict[str, str]:
    return {
        h.CONTENT_TYPE: content_type.value,
        h.MESSAGE_TYPE: registry.name,
        h.MESSAGE_VERSION: str(registry.versions[-1] if version is None else version),
    }


def _encode_raw(data: Any, content_type: ContentType) -> bytes:
    if content_type is ContentType.CBOR:
        return bytes(cbor2.dumps(data))
    return json.dumps(data).encode()


def _only_protocol_errors(
    registry: VersionedMessage[Any], headers: dict[str, str], body: bytes
) -> Exception | None:
    """Decode; return the error if it is a typed protocol error. Any other exception fails the test."""
    try:
        message = registry.decode(headers, body)
    except ProtocolError as err:
        assert isinstance(err, RebaserError)
        return err
    assert type(message) is registry.current  # a mutation that happens to stay valid is fine
    return None


def _expect_decode_error(
    registry: VersionedMessage[Any], headers: dict[str, str], body: bytes
) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        registry.decode(headers, body)
    assert isinstance(info.value, ProtocolError)
    assert isinstance(info.value, RebaserError)
    return info.value


# -- garbled bodies -------------------------------------------------------------------------------------------


@FUZZ
@given(st.sampled_from(REGISTRIES), st.sampled_from(list(ContentType)), st.binary(max_size=512))
def test_random_bytes_raise_decode_error(
    registry: VersionedMessage[Any], content_type: ContentType, body: bytes
) -> None:
    err = _only_protocol_errors(registry, _headers(registry, content_type), body)
    assert isinstance(err, DecodeError)


@FUZZ
@given(
    st.sampled_from(SAMPLES),
    st.sampled_from(list(ContentType)),
    st.lists(
        st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)), min_size=1, max_size=4
    ),
)
def test_byte_flips_in_valid_bodies_never_raise_untyped_errors(
    sample: tuple[VersionedMessage[Any], MessageVersion],
    content_type: ContentType,
    flips: list[tuple[int, int]],
) -> None:
    registry, message = sample
    headers, body = registry.encode(message, content_type)
    mutated = bytearray(body)
    for position, value in flips:
        mutated[position % len(mutated)] = value
    _only_protocol_errors(registry, headers, bytes(mutated))


@pytest.mark.parametrize("content_type", list(ContentType))
@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_every_truncation_of_a_valid_body_raises_decode_error(
    sample: tuple[VersionedMessage[Any], MessageVersion], content_type: ContentType
) -> None:
    registry, message = sample
    headers, body = registry.encode(message, content_type)
    assert registry.decode(headers, body) == registry.upgrade(message)
    for cut in range(len(body)):
        _expect_decode_error(registry, headers, body[:cut])


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=15), children, max_size=5)
    ),
    max_leaves=12,
)


@FUZZ
@given(st.sampled_from(REGISTRIES), st.sampled_from(list(ContentType)), json_like)
def test_well_formed_data_of_the_wrong_shape_raises_decode_error(
    registry: VersionedMessage[Any], content_type: ContentType, data: Any
) -> None:
    _expect_decode_error(registry, _headers(registry, content_type), _encode_raw(data, content_type))


@FUZZ
@given(
    st.sampled_from(list(ContentType)), st.sampled_from(["id", "workspace_id", "change_set_id"]), json_like
)
def test_any_other_value_for_an_id_raises_decode_error(
    content_type: ContentType, field: str, value: Any
) -> None:
    if isinstance(value, str):
        try:
            RequestId.parse(value)
        except InvalidId:
            pass
        else:  # pragma: no cover - a random valid ULID is astronomically unlikely
            assume(False)
    data = SAMPLES[3][1].model_dump(mode="json")
    data[field] = value
    _expect_decode_error(REQUEST, _headers(REQUEST, content_type), _encode_raw(data, content_type))


# CBOR can carry values JSON cannot: none of them is a valid field value.
CBOR_ONLY = [
    b"bytes",
    bytearray(b"x"),
    cbor2.CBORTag(4000, "x"),
    cbor2.undefined,
    frozenset({1, 2}),
    cbor2.CBORSimpleValue(99),
]


@pytest.mark.parametrize("value", CBOR_ONLY, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("where", ["body", "id", "address", "value", "status"])
def test_cbor_only_values_raise_decode_error(value: Any, where: str) -> None:
    data: Any
    registry: VersionedMessage[Any]
    if where == "body":
        registry, data = REQUEST, value
    elif where == "status":
        registry, data = RESPONSE, SAMPLES[4][1].model_dump(mode="json")
        data["status"]["updates_performed"] = value
    else:
        registry, data = REQUEST, SAMPLES[2][1].model_dump(mode="json")
        if where == "id":
            data["id"] = value
        elif where == "address":
            data["updates"] = {"kind": "stored", "address": value}
        else:
            data["updates"]["updates"][0]["value"] = value
    headers, body = _headers(registry, ContentType.CBOR), _encode_raw(data, ContentType.CBOR)
    if where == "address" and isinstance(value, bytes | bytearray):
        # pydantic's lax mode reads a UTF-8 byte string as text; accepting it is fine, crashing is not.
        _only_protocol_errors(registry, headers, body)
    else:
        _expect_decode_error(registry, headers, body)


BAD_IDS = [
    "",
    "01JAW0QC8E0G2J4M6P8S0V2X4",  # 25 chars
    "01JAW0QC8E0G2J4M6P8S0V2X4ZZ",  # 27 chars
    "01JAW0QC8E0G2J4M6P8S0V2X4.",
    "01JAW0QC8E0G2J4M6P8S0V2X4*",
    "01JAW0QC8E0G2J4M6P8S0V2X4>",
    "01JAW0QC8E.G2J4M6P8S0V2X4Z",
    "*",
    ">",
    "01JAW0QC8E0G2J4M6P8S0V2X4 ",
    "01JAW0QC8E0G2J4M6P8S0V2XIL",  # I and L are not Crockford base32 digits
    "8ZZZZZZZZZZZZZZZZZZZZZZZZZ",  # overflows 128 bits
]


@pytest.mark.parametrize("content_type", list(ContentType))
@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("field", ["id", "workspace_id", "change_set_id", "from_change_set_id"])
def test_invalid_id_strings_raise_decode_error(content_type: ContentType, bad: str, field: str) -> None:
    data = SAMPLES[2][1].model_dump(mode="json")
    data[field] = bad
    err = _expect_decode_error(REQUEST, _headers(REQUEST, content_type), _encode_raw(data, content_type))
    assert field in str(err)


def _set(path: tuple[Any, ...], value: Any) -> Callable[[Any], None]:
    def mutate(data: Any) -> None:
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value

    return mutate


def _delete(path: tuple[Any, ...]) -> Callable[[Any], None]:
    def mutate(data: Any) -> None:
        for key in path[:-1]:
            data = data[key]
        del data[path[-1]]

    return mutate


U = ("updates", "updates")  # the inline update list of the v3 sample
REQUEST_MUTATIONS: dict[str, Callable[[Any], None]] = {
    "extra top-level field": _set(("priority",), 1),
    "extra field in updates": _set(("updates", "compressed"), False),
    "extra field in an update": _set((*U, 0, "ttl"), 5),
    "missing id": _delete(("id",)),
    "missing workspace_id": _delete(("workspace_id",)),
    "missing change_set_id": _delete(("change_set_id",)),
    "missing updates": _delete(("updates",)),
    "missing kind": _delete(("updates", "kind")),
    "missing op": _delete((*U, 0, "op")),
    "missing path": _delete((*U, 0, "path")),
    "missing value": _delete((*U, 0, "value")),
    "missing function": _delete((*U, 1, "function")),
    "unknown kind": _set(("updates", "kind"), "remote"),
    "unknown op": _set((*U, 0, "op"), "delete"),
    "op of another shape": _set((*U, 2, "op"), "set_function"),
    "updates not a list": _set((*U,), {"0": {}}),
    "updates a string": _set(("updates",), "sha256:abc"),
    "path without leading slash": _set((*U, 0, "path"), "a/b"),
    "path of one slash": _set((*U, 0, "path"), "/"),
    "path with empty segment": _set((*U, 0, "path"), "/a//b"),
    "path with trailing slash": _set((*U, 0, "path"), "/a/"),
    "path with space": _set((*U, 0, "path"), "/a b"),
    "path with tab": _set((*U, 0, "path"), "/a\tb"),
    "path too long": _set((*U, 0, "path"), "/" + "a" * 1024),
    "path an int": _set((*U, 0, "path"), 7),
    "bad path in args": _set((*U, 1, "args"), ["/ok", "not a path"]),
    "args not a list": _set((*U, 1, "args"), "/a/b"),
    "empty function": _set((*U, 1, "function"), ""),
    "function too long": _set((*U, 1, "function"), "f" * 129),
    "expected_version an int": _set((*U, 2, "expected_version"), 12),
    "empty event_session_id": _set(("event_session_id",), ""),
    "event_session_id too long": _set(("event_session_id",), "s" * 65),
    "event_session_id a list": _set(("event_session_id",), ["s"]),
    "stored with updates list": _set(("updates",), {"kind": "stored", "updates": []}),
    "empty stored address": _set(("updates",), {"kind": "stored", "address": ""}),
    "body is a list": lambda data: data.clear() or data.update({"__list__": True}),
}


@pytest.mark.parametrize("content_type", list(ContentType))
@pytest.mark.parametrize("mutation", list(REQUEST_MUTATIONS))
def test_request_of_the_wrong_shape_raises_decode_error(content_type: ContentType, mutation: str) -> None:
    data: Any = copy.deepcopy(SAMPLES[2][1].model_dump(mode="json"))
    REQUEST_MUTATIONS[mutation](data)
    if "__list__" in data:
        data = list(SAMPLES[2][1].model_dump(mode="json").values())
    _expect_decode_error(REQUEST, _headers(REQUEST, content_type), _encode_raw(data, content_type))


OLD_REQUEST_MUTATIONS: dict[str, Callable[[Any], None]] = {
    "v1 with v3 updates": _set(("updates",), {"kind": "stored", "address": "a"}),
    "v1 without updates_address": _delete(("updates_address",)),
    "v1 with empty updates_address": _set(("updates_address",), ""),
    "v1 with extra field": _set(("extra",), None),
}


@pytest.mark.parametrize("content_type", list(ContentType))
@pytest.mark.parametrize("mutation", list(OLD_REQUEST_MUTATIONS))
def test_old_request_of_the_wrong_shape_raises_decode_error(content_type: ContentType, mutation: str) -> None:
    data = SAMPLES[0][1].model_dump(mode="json")
    OLD_REQUEST_MUTATIONS[mutation](data)
    _expect_decode_error(REQUEST, _headers(REQUEST, content_type, version=1), _encode_raw(data, content_type))


@pytest.mark.parametrize("content_type", list(ContentType))
def test_v2_field_in_a_v1_body_raises_decode_error(content_type: ContentType) -> None:
    data = SAMPLES[1][1].model_dump(mode="json")  # a v2 body announced as v1
    _expect_decode_error(REQUEST, _headers(REQUEST, content_type, version=1), _encode_raw(data, content_type))


RESPONSE_STATUSES: dict[str, Any] = {
    "unknown kind": {"kind": "ok", "updates_performed": 1},
    "missing kind": {"updates_performed": 1},
    "negative updates_performed": {"kind": "success", "updates_performed": -1},
    "updates_performed not a number": {"kind": "success", "updates_performed": "three"},
    "updates_performed a fraction": {"kind": "success", "updates_performed": 1.5},
    "success with extra field": {"kind": "success", "updates_performed": 1, "extra": True},
    "error without message": {"kind": "error"},
    "error message not a string": {"kind": "error", "message": 42},
    "retryable not a bool": {"kind": "error", "message": "x", "retryable": "maybe"},
    "conflicts not a list": {"kind": "conflicts", "conflicts": {"path": "/a"}},
    "conflict without path": {
        "kind": "conflicts",
        "conflicts": [{"expected_version": None, "actual_version": None}],
    },
    "status a string": "success",
    "status null": None,
}


@pytest.mark.parametrize("content_type", list(ContentType))
@pytest.mark.parametrize("status", list(RESPONSE_STATUSES))
def test_response_of_the_wrong_shape_raises_decode_error(content_type: ContentType, status: str) -> None:
    data = SAMPLES[4][1].model_dump(mode="json")
    data["status"] = RESPONSE_STATUSES[status]
    _expect_decode_error(RESPONSE, _headers(RESPONSE, content_type), _encode_raw(data, content_type))


@pytest.mark.parametrize("content_type", list(ContentType))
def test_a_request_body_under_response_headers_raises_decode_error(content_type: ContentType) -> None:
    _, body = REQUEST.encode(SAMPLES[3][1], content_type)
    _expect_decode_error(RESPONSE, _headers(RESPONSE, content_type), body)


def test_a_json_body_announced_as_cbor_raises_decode_error() -> None:
    _, body = REQUEST.encode(SAMPLES[3][1], ContentType.JSON)
    _expect_decode_error(REQUEST, _headers(REQUEST, ContentType.CBOR), body)


def test_a_cbor_body_announced_as_json_raises_decode_error() -> None:
    _, body = REQUEST.encode(SAMPLES[3][1], ContentType.CBOR)
    _expect_decode_error(REQUEST, _headers(REQUEST, ContentType.JSON), body)


@pytest.mark.parametrize("content_type", list(ContentType))
def test_an_empty_body_raises_decode_error(content_type: ContentType) -> None:
    _expect_decode_error(REQUEST, _headers(REQUEST, content_type), b"")


def test_deeply_nested_values_raise_decode_error_not_recursion_error() -> None:
    depth = 100_000
    _expect_decode_error(REQUEST, _headers(REQUEST, ContentType.JSON), b"[" * depth + b"]" * depth)
    _expect_decode_error(REQUEST, _headers(REQUEST, ContentType.CBOR), b"\x81" * depth + b"\x80")


def test_cyclic_cbor_raises_decode_error() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    data = SAMPLES[2][1].model_dump(mode="json")
    data["updates"]["updates"][0]["value"] = cyclic
    body = cbor2.dumps(data, value_sharing=True)
    _expect_decode_error(REQUEST, _headers(REQUEST, ContentType.CBOR), body)


# -- headers, checked before the body ---------------------------------------------------------------------------


@pytest.fixture
def body_never_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any attempt to decode a body fail loudly, to prove a header error comes first."""

    def refuse(body: bytes, content_type: ContentType) -> Any:
        raise AssertionError("the body was decoded although the headers were refused")

    monkeypatch.setattr(versioned_module, "decode_body", refuse)


def _valid_headers(**overrides: str | None) -> dict[str, str]:
    headers = _headers(REQUEST, ContentType.JSON)
    names = {"content_type": h.CONTENT_TYPE, "message_type": h.MESSAGE_TYPE, "version": h.MESSAGE_VERSION}
    for key, value in overrides.items():
        if value is None:
            del headers[names[key]]
        else:
            headers[names[key]] = value
    return headers


HeaderCase = tuple[str, dict[str, str | None], type[ProtocolError]]


def _version_case(version: str) -> HeaderCase:
    return (f"version {version!r}", {"version": version}, UnsupportedMessageVersion)


HEADER_CASES: list[HeaderCase] = [
    ("missing message type", {"message_type": None}, MissingHeader),
    ("wrong message type", {"message_type": "EnqueueUpdatesResponse"}, UnsupportedMessageType),
    ("unknown message type", {"message_type": "PurgeChangeSetRequest"}, UnsupportedMessageType),
    ("message type in lower case", {"message_type": "enqueueupdatesrequest"}, UnsupportedMessageType),
    ("empty message type", {"message_type": ""}, UnsupportedMessageType),
    ("missing version", {"version": None}, MissingHeader),
    *[
        _version_case(v)
        for v in [
            "0",
            "4",
            "abc",
            "",
            "1.0",
            "-1",
            "+1",
            " 1",
            "1 ",
            "1e0",
            "0x1",
            "٣",
            "³",
            "99999999999999999999",
        ]
    ],
    ("content type xml", {"content_type": "application/xml"}, UnsupportedContentType),
    ("content type text", {"content_type": "text/plain"}, UnsupportedContentType),
    ("content type cbor-ish", {"content_type": "application/cbor-seq"}, UnsupportedContentType),
    ("content type msgpack", {"content_type": "application/msgpack"}, UnsupportedContentType),
]


@pytest.mark.usefixtures("body_never_decoded")
@pytest.mark.parametrize(("case", "overrides", "error"), HEADER_CASES, ids=[c[0] for c in HEADER_CASES])
@pytest.mark.parametrize("body", [GARBAGE, b""], ids=["garbage-body", "empty-body"])
def test_bad_headers_are_refused_before_decoding(
    case: str, overrides: dict[str, str | None], error: type[ProtocolError], body: bytes
) -> None:
    headers = _valid_headers(**overrides)
    with pytest.raises(error) as from_negotiate:
        REQUEST.negotiate(headers)
    with pytest.raises(error) as from_decode:
        REQUEST.decode(headers, body)
    for err in (from_negotiate.value, from_decode.value):
        assert type(err) is error  # the specific error, in particular not DecodeError
        assert isinstance(err, ProtocolError)
        assert isinstance(err, RebaserError)


@pytest.mark.usefixtures("body_never_decoded")
def test_header_errors_say_what_was_wrong() -> None:
    with pytest.raises(MissingHeader) as missing_type:
        REQUEST.decode(_valid_headers(message_type=None), GARBAGE)
    assert missing_type.value.header == h.MESSAGE_TYPE

    with pytest.raises(MissingHeader) as missing_version:
        REQUEST.decode(_valid_headers(version=None), GARBAGE)
    assert missing_version.value.header == h.MESSAGE_VERSION

    with pytest.raises(UnsupportedMessageType) as wrong_type:
        REQUEST.decode(_valid_headers(message_type="Nope"), GARBAGE)
    assert (wrong_type.value.message_type, wrong_type.value.expected) == ("Nope", "EnqueueUpdatesRequest")

    with pytest.raises(UnsupportedMessageVersion) as wrong_version:
        REQUEST.decode(_valid_headers(version="4"), GARBAGE)
    assert wrong_version.value.version == "4"
    assert wrong_version.value.supported == (1, 2, 3)
    assert wrong_version.value.message_type == "EnqueueUpdatesRequest"

    with pytest.raises(UnsupportedContentType) as wrong_content_type:
        REQUEST.decode(_valid_headers(content_type="application/xml"), GARBAGE)
    assert wrong_content_type.value.content_type == "application/xml"
    assert set(wrong_content_type.value.supported) == {"application/cbor", "application/json"}


@pytest.mark.usefixtures("body_never_decoded")
@pytest.mark.parametrize("headers", [None, {}], ids=["none", "empty"])
def test_no_headers_at_all_is_a_missing_message_type(headers: dict[str, str] | None) -> None:
    with pytest.raises(MissingHeader) as info:
        REQUEST.decode(headers, GARBAGE)
    assert info.value.header == h.MESSAGE_TYPE


@pytest.mark.usefixtures("body_never_decoded")
def test_unsupported_content_type_is_reported_first() -> None:
    # Every header is wrong: the content type is checked first, so that is the error the sender sees.
    headers = {h.CONTENT_TYPE: "application/xml", h.MESSAGE_TYPE: "Nope", h.MESSAGE_VERSION: "9"}
    with pytest.raises(UnsupportedContentType):
        REQUEST.decode(headers, GARBAGE)


def test_response_versions_other_than_1_2_and_3_are_unsupported() -> None:
    for version in ("0", "4", "5"):
        with pytest.raises(UnsupportedMessageVersion):
            RESPONSE.negotiate(_headers(RESPONSE, ContentType.CBOR) | {h.MESSAGE_VERSION: version})
    with pytest.raises(UnsupportedMessageType):
        RESPONSE.negotiate(_headers(REQUEST, ContentType.CBOR))


@pytest.mark.parametrize(
    "value",
    [
        "APPLICATION/JSON; charset=utf-8",
        "application/json",
        " application/json ",
        "Application/Json;charset=UTF-8",
    ],
)
def test_json_content_type_is_case_insensitive_and_may_carry_parameters(value: str) -> None:
    message = SAMPLES[3][1]
    headers, body = REQUEST.encode(message, ContentType.JSON)
    headers[h.CONTENT_TYPE] = value
    assert REQUEST.negotiate(headers).content_type is ContentType.JSON
    assert REQUEST.decode(headers, body) == message


@pytest.mark.parametrize("value", ["APPLICATION/CBOR", "application/cbor; foo=bar"])
def test_cbor_content_type_is_case_insensitive_and_may_carry_parameters(value: str) -> None:
    message = SAMPLES[3][1]
    headers, body = REQUEST.encode(message, ContentType.CBOR)
    headers[h.CONTENT_TYPE] = value
    assert REQUEST.decode(headers, body) == message


def test_missing_content_type_means_cbor() -> None:
    message = SAMPLES[2][1]
    headers, body = REQUEST.encode(message, ContentType.CBOR)
    del headers[h.CONTENT_TYPE]
    assert REQUEST.negotiate(headers).content_type is ContentType.CBOR
    assert REQUEST.decode(headers, body) == message
    # ... so a JSON body without the header is read as CBOR, and refused as such.
    _, json_body = REQUEST.encode(message, ContentType.JSON)
    with pytest.raises(DecodeError):
        REQUEST.decode(headers, json_body)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_every_supported_version_negotiates(version: int) -> None:
    negotiated = REQUEST.negotiate(_headers(REQUEST, ContentType.JSON, version))
    assert negotiated.version == version
    assert negotiated.content_type is ContentType.JSON


@FUZZ
@given(st.text(max_size=12))
def test_any_version_header_negotiates_or_is_unsupported(raw: str) -> None:
    headers = _valid_headers(version=raw)
    try:
        negotiated = REQUEST.negotiate(headers)
    except UnsupportedMessageVersion as err:
        assert err.version == raw
    else:
        assert negotiated.version == int(raw)
        assert negotiated.version in REQUEST.versions


@FUZZ
@given(st.text(max_size=40))
def test_any_message_type_header_negotiates_or_is_unsupported(raw: str) -> None:
    try:
        REQUEST.negotiate(_valid_headers(message_type=raw))
    except UnsupportedMessageType as err:
        assert raw != REQUEST.name
        assert err.message_type == raw
    else:
        assert raw == REQUEST.name


@FUZZ
@given(st.text(max_size=40))
def test_any_content_type_header_negotiates_or_is_unsupported(raw: str) -> None:
    try:
        negotiated = REQUEST.negotiate(_valid_headers(content_type=raw))
    except UnsupportedContentType as err:
        assert err.content_type == raw
    else:
        base = raw.split(";", 1)[0].strip().lower()
        assert negotiated.content_type is (ContentType(base) if raw else ContentType.CBOR)


# -- regressions: defects that must not come back ----------------------------------------------------------------


def test_absurdly_long_version_header_is_unsupported() -> None:
    with pytest.raises(UnsupportedMessageVersion):
        REQUEST.negotiate(_valid_headers(version="1" * 5000))


def _v3_json(value_json: str) -> bytes:
    data = SAMPLES[3][1].model_dump(mode="json")
    data["updates"] = {"kind": "inline", "updates": [{"op": "set", "path": "/a", "value": "__V__"}]}
    return json.dumps(data).replace('"__V__"', value_json).encode()


def _v3_cbor(value: Any) -> bytes:
    data = SAMPLES[3][1].model_dump(mode="json")
    data["updates"] = {"kind": "inline", "updates": [{"op": "set", "path": "/a", "value": value}]}
    return bytes(cbor2.dumps(data))


ACCEPTED_BUT_NOT_REENCODABLE = [
    pytest.param(ContentType.JSON, _v3_json("NaN"), id="json-NaN"),
    pytest.param(ContentType.JSON, _v3_json("Infinity"), id="json-Infinity"),
    pytest.param(ContentType.JSON, _v3_json("[-Infinity]"), id="json-minus-Infinity"),
    pytest.param(ContentType.CBOR, _v3_cbor(float("nan")), id="cbor-nan"),
    pytest.param(ContentType.CBOR, _v3_cbor({"x": float("inf")}), id="cbor-inf"),
    pytest.param(ContentType.JSON, _v3_json('"\\ud800"'), id="json-lone-surrogate"),
    pytest.param(ContentType.CBOR, _v3_cbor(10**5000), id="cbor-5000-digit-bignum"),
]


@pytest.mark.parametrize(("content_type", "body"), ACCEPTED_BUT_NOT_REENCODABLE)
def test_whatever_decodes_can_be_encoded_again_in_both_codecs(content_type: ContentType, body: bytes) -> None:
    try:
        message = REQUEST.decode(_headers(REQUEST, content_type), body)
    except DecodeError:
        return  # refusing such a body is a correct answer
    for other in ContentType:
        headers, again = REQUEST.encode(message, other)
        assert REQUEST.decode(headers, again) == message


def test_trailing_bytes_after_a_cbor_body_raise_decode_error() -> None:
    headers, body = REQUEST.encode(SAMPLES[3][1], ContentType.CBOR)
    _expect_decode_error(REQUEST, headers, body + b"\x00")


@pytest.mark.parametrize("trailer", [b"\x00", b" x", b"{}"])
def test_trailing_bytes_after_a_json_body_raise_decode_error(trailer: bytes) -> None:
    headers, body = REQUEST.encode(SAMPLES[3][1], ContentType.JSON)
    _expect_decode_error(REQUEST, headers, body + trailer)
