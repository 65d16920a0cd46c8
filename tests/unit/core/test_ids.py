"""Typed ULID ids: creation, parsing, printing, type distinctness and pydantic validation."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from ulid import ULID

from rebaser_core.errors import InvalidId, RebaserError
from rebaser_core.ids import ChangeSetId, RequestId, UlidId, WorkspacePk

ID_TYPES: list[type[UlidId]] = [WorkspacePk, ChangeSetId, RequestId]
CANONICAL = re.compile(r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$")  # Crockford base32, at most 128 bits
SAMPLE = "01JAW0Q7NB2K5Z8R4V6X9C3D1E"


@pytest.mark.parametrize("kind", ID_TYPES)
def test_new_prints_a_canonical_ulid_that_parses_back(kind: type[UlidId]) -> None:
    value = kind.new()
    text = str(value)
    assert CANONICAL.fullmatch(text)
    assert kind.parse(text) == value
    assert kind(text) == value
    assert type(kind.parse(text)) is kind
    assert isinstance(value.ulid, ULID)
    assert repr(value) == f"{kind.__name__}({text!r})"


@pytest.mark.parametrize("kind", ID_TYPES)
def test_new_ids_are_distinct(kind: type[UlidId]) -> None:
    assert len({kind.new() for _ in range(1000)}) == 1000


@settings(max_examples=200, deadline=None, database=None)
@given(st.integers(min_value=0, max_value=2**128 - 1), st.sampled_from(ID_TYPES))
def test_parse_and_str_round_trip_over_the_whole_range(number: int, kind: type[UlidId]) -> None:
    ulid = ULID.from_int(number)
    value = kind(ulid)
    text = str(value)
    assert text == str(ulid)
    assert len(text) == 26
    assert CANONICAL.fullmatch(text)
    assert kind.parse(text) == value
    assert kind.parse(text.lower()) == value
    assert kind(value) == value


def test_lower_case_is_accepted_and_printed_upper_case() -> None:
    value = ChangeSetId.parse(SAMPLE.lower())
    assert value == ChangeSetId.parse(SAMPLE)
    assert str(value) == SAMPLE


def test_extremes_of_the_range() -> None:
    assert str(RequestId.parse("0" * 26)) == "0" * 26
    assert str(RequestId.parse("7" + "Z" * 25)) == "7" + "Z" * 25


INVALID = [
    "",
    "0",
    SAMPLE[:-1],  # too short
    SAMPLE + "0",  # too long
    " " * 26,
    SAMPLE[:-1] + " ",
    " " + SAMPLE[1:],
    SAMPLE[:10] + " " + SAMPLE[11:],
    SAMPLE[:-1] + ".",
    SAMPLE[:-1] + "*",
    SAMPLE[:-1] + ">",
    SAMPLE[:5] + "." + SAMPLE[6:],
    SAMPLE[:-1] + "\n",
    SAMPLE[:-1] + "\x00",
    SAMPLE[:-1] + "I",  # I, L, O and U are not Crockford base32 digits
    SAMPLE[:-1] + "L",
    SAMPLE[:-1] + "O",
    SAMPLE[:-1] + "U",
    SAMPLE[:-1] + "-",
    SAMPLE[:-1] + "é",
    "8ZZZZZZZZZZZZZZZZZZZZZZZZZ",  # overflows 128 bits
    "Z" * 26,
    "ß" * 26,  # upper-cases to 52 characters
    "٣" * 26,  # a digit, but not an ASCII one
]


@pytest.mark.parametrize("kind", ID_TYPES)
@pytest.mark.parametrize("text", INVALID)
def test_invalid_strings_raise_invalid_id(kind: type[UlidId], text: str) -> None:
    with pytest.raises(InvalidId) as info:
        kind.parse(text)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, RebaserError)
    assert kind.__name__ in str(info.value)
    with pytest.raises(InvalidId):
        kind(text)


@pytest.mark.parametrize("value", [None, 5, 1.5, b"01JAW0Q7NB2K5Z8R4V6X9C3D1E", ["x"]])
def test_non_strings_raise_invalid_id(value: object) -> None:
    with pytest.raises(InvalidId):
        WorkspacePk(value)  # type: ignore[arg-type]


def test_distinct_types_are_never_equal() -> None:
    ulid = ULID.from_str(SAMPLE)
    ws, cs, req = WorkspacePk(ulid), ChangeSetId(ulid), RequestId(ulid)
    assert str(ws) == str(cs) == str(req)
    assert ws != cs
    assert cs != req
    assert ws != req
    assert ws != SAMPLE  # nor equal to their text
    assert ws != ulid
    assert len({ws, cs, req}) == 3
    assert ws == WorkspacePk(SAMPLE)
    assert hash(ws) == hash(WorkspacePk(SAMPLE))


def test_ids_are_immutable() -> None:
    value = RequestId.parse(SAMPLE)
    with pytest.raises(AttributeError):
        value._ulid = ULID()
    with pytest.raises(AttributeError):
        setattr(value, "other", 1)  # noqa: B010


def test_ids_order_like_their_ulids() -> None:
    low, high = RequestId(ULID.from_int(1)), RequestId(ULID.from_int(2**100))
    assert low < high
    assert sorted([high, low]) == [low, high]


class _Model(BaseModel):
    workspace_id: WorkspacePk
    change_set_id: ChangeSetId
    maybe: RequestId | None = None


def test_pydantic_fields_parse_and_serialise_as_text() -> None:
    model = _Model.model_validate({"workspace_id": SAMPLE, "change_set_id": SAMPLE.lower()})
    assert model.workspace_id == WorkspacePk(SAMPLE)
    assert model.change_set_id == ChangeSetId(SAMPLE)
    assert model.model_dump(mode="json") == {"workspace_id": SAMPLE, "change_set_id": SAMPLE, "maybe": None}
    assert model.model_dump()["workspace_id"] == SAMPLE
    assert _Model.model_validate_json(model.model_dump_json()) == model
    # An instance of the right type is taken as is.
    ws = WorkspacePk.new()
    assert _Model(workspace_id=ws, change_set_id=ChangeSetId(SAMPLE)).workspace_id is ws


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "nope",
        SAMPLE[:-1] + ".",
        SAMPLE[:-1] + "*",
        "8ZZZZZZZZZZZZZZZZZZZZZZZZZ",
        42,
        None,
        ["x"],
        {"a": 1},
    ],
)
def test_pydantic_field_validation_error_for_a_bad_id(bad: object) -> None:
    with pytest.raises(ValidationError) as info:
        _Model.model_validate({"workspace_id": bad, "change_set_id": SAMPLE})
    errors = info.value.errors()
    assert len(errors) == 1
    assert errors[0]["loc"] == ("workspace_id",)


def test_pydantic_refuses_an_id_of_another_type() -> None:
    with pytest.raises(ValidationError) as info:
        _Model.model_validate({"workspace_id": ChangeSetId(SAMPLE), "change_set_id": ChangeSetId(SAMPLE)})
    assert info.value.errors()[0]["loc"] == ("workspace_id",)


def test_pydantic_json_schema_describes_a_26_character_string() -> None:
    schema = _Model.model_json_schema()["properties"]["workspace_id"]
    assert schema["type"] == "string"
    assert schema["minLength"] == schema["maxLength"] == 26


@settings(max_examples=300, deadline=None, database=None)
@given(st.integers(min_value=0, max_value=2**48 - 1), st.integers(min_value=0, max_value=2**80 - 1))
def test_the_fresh_id_encoder_writes_what_python_ulid_writes(ms: int, randomness: int) -> None:
    from rebaser_core.ids import _encode_random, _encode_time

    assert _encode_time(ms) + _encode_random(randomness) == str(ULID.from_int((ms << 80) | randomness))


def test_fresh_ids_count_up_within_a_millisecond_and_carry_the_time() -> None:
    made = [str(RequestId.new()) for _ in range(500)]
    assert made == sorted(made)
    ms = ULID.from_str(made[-1]).milliseconds
    import time

    assert abs(ms - time.time() * 1000) < 60_000


def test_an_unordered_ulid_is_fresh_and_valid_and_tells_its_millisecond() -> None:
    import time

    from rebaser_core.ids import new_unordered_ulid_text, ulid_milliseconds

    before = time.time_ns() // 1_000_000
    texts = [new_unordered_ulid_text() for _ in range(3000)]  # several refills of the random pool
    after = time.time_ns() // 1_000_000
    assert len(set(texts)) == len(texts)
    for text in texts:
        ms = ULID.from_str(str(RequestId(text))).milliseconds
        assert before <= ms <= after
        assert ulid_milliseconds(text) == ms
    # The random part is spread over the whole alphabet (drawn five bits a character, not stuck).
    assert len({c for text in texts for c in text[10:]}) == 32


@given(st.integers(min_value=0, max_value=2**48 - 1))
def test_the_millisecond_of_any_ulid_is_read_back(ms: int) -> None:
    from rebaser_core.ids import ulid_milliseconds

    assert (
        ulid_milliseconds(str(ULID.from_timestamp(ms / 1000))) == ULID.from_timestamp(ms / 1000).milliseconds
    )


def test_a_forked_child_draws_its_own_unordered_ulids() -> None:
    import os

    from rebaser_core import ids
    from rebaser_core.ids import new_unordered_ulid_text

    new_unordered_ulid_text()
    ids._random_at[0] = 0  # the parent's pool is full: without a draw of its own, the child would repeat it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.write(write, "".join(new_unordered_ulid_text()[10:] for _ in range(8)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 1024).decode()
    os.close(read)
    assert child != "".join(new_unordered_ulid_text()[10:] for _ in range(8))


def test_validated_text_is_an_id_of_the_field_type() -> None:
    model = _Model.model_validate({"workspace_id": SAMPLE, "change_set_id": SAMPLE})
    assert type(model.workspace_id) is WorkspacePk and type(model.change_set_id) is ChangeSetId
    assert model.workspace_id == WorkspacePk.parse(SAMPLE)
    assert hash(model.change_set_id) == hash(ChangeSetId.parse(SAMPLE))
    assert model.workspace_id != model.change_set_id  # same text, different kinds


def test_a_str_subclass_is_validated_like_a_str() -> None:
    class Text(str):
        pass

    model = _Model.model_validate({"workspace_id": Text(SAMPLE.lower()), "change_set_id": SAMPLE})
    assert str(model.workspace_id) == SAMPLE and type(str(model.workspace_id)) is str
