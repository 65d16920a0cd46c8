"""Subjects and stream names (docs/design.md §1), with and without a prefix, and parsing them back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ulid import ULID

from rebaser_core.errors import InvalidSubject, RebaserError
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.subject_parsing import ParsedSubject
from rebaser_core.subjects import Subjects, validate_prefix

WK = "01JAW0Q7NB2K5Z8R4V6X9C3D1E"
CS = "01JAW0Q8F3T6M9P2S5V8Y1B4C7"
WS_ID, CS_ID = WorkspacePk(WK), ChangeSetId(CS)


def _matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` is one or more tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return i == len(p) - 1 and len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def _overlap(a: str, b: str) -> bool:
    """Whether two subject filters can match a common subject."""
    ta, tb = a.split("."), b.split(".")
    for i in range(max(len(ta), len(tb))):
        x = ta[i] if i < len(ta) else None
        y = tb[i] if i < len(tb) else None
        if x == ">" or y == ">":
            return x is not None and y is not None
        if x is None or y is None:
            return False
        if x != y and "*" not in (x, y):
            return False
    return True


def test_matching_helpers() -> None:
    assert _matches("a.*.c", "a.b.c")
    assert _matches("a.>", "a.b.c")
    assert not _matches("a.>", "a")
    assert not _matches("a.*", "a.b.c")
    assert _overlap("a.>", "a.b.*")
    assert not _overlap("a.b.>", "a.c.>")
    assert not _overlap("a.*", "a.b.c")


# -- names, exactly as in docs/design.md §1 ---------------------------------------------------------------------


def test_unprefixed_names() -> None:
    s = Subjects()
    assert s.prefix is None
    assert s.requests_stream == "REBASER_REQUESTS"
    assert s.tasks_stream == "REBASER_TASKS"
    assert s.dead_letter_stream == "REBASER_DEAD_LETTERS"
    assert s.change_sets_bucket == "REBASER_CHANGE_SETS"
    assert s.tasks_consumer == "rebaser-tasks"
    assert s.requests_all == "rebaser.requests.>"
    assert s.tasks_all == "rebaser.tasks.>"
    assert s.tasks_filter == "rebaser.tasks.*.*.*"
    assert s.dead_letters_all == "dlq.rebaser.requests.>"
    assert s.requests(WS_ID, CS_ID) == f"rebaser.requests.{WK}.{CS}"
    assert s.task(WS_ID, CS_ID) == f"rebaser.tasks.{WK}.{CS}.process"
    assert s.dead_letter(WS_ID, CS_ID) == f"dlq.rebaser.requests.{WK}.{CS}"
    assert s.change_set_key(WS_ID, CS_ID) == f"{WK}.{CS}"


def test_prefixed_names() -> None:
    s = Subjects("P")
    assert s.prefix == "P"
    assert s.requests_stream == "P_REBASER_REQUESTS"
    assert s.tasks_stream == "P_REBASER_TASKS"
    assert s.dead_letter_stream == "P_REBASER_DEAD_LETTERS"
    assert s.change_sets_bucket == "P_REBASER_CHANGE_SETS"
    assert s.tasks_consumer == "rebaser-tasks"  # consumer names live inside their (prefixed) stream
    assert s.requests_all == "P.rebaser.requests.>"
    assert s.tasks_all == "P.rebaser.tasks.>"
    assert s.tasks_filter == "P.rebaser.tasks.*.*.*"
    assert s.dead_letters_all == "P.dlq.rebaser.requests.>"
    assert s.requests(WS_ID, CS_ID) == f"P.rebaser.requests.{WK}.{CS}"
    assert s.task(WS_ID, CS_ID) == f"P.rebaser.tasks.{WK}.{CS}.process"
    assert s.dead_letter(WS_ID, CS_ID) == f"P.dlq.rebaser.requests.{WK}.{CS}"
    assert s.change_set_key(WS_ID, CS_ID) == f"{WK}.{CS}"  # keys live inside the (prefixed) bucket


@pytest.mark.parametrize("prefix", [None, "", "P", "test-42_a", "t01JAW0Q7NB2K5Z8R4V6X9C3D1E"])
def test_every_subject_falls_in_its_own_stream_only(prefix: str | None) -> None:
    s = Subjects(prefix)
    streams = {"requests": s.requests_all, "tasks": s.tasks_all, "dead letters": s.dead_letters_all}
    subjects = {
        "requests": s.requests(WS_ID, CS_ID),
        "tasks": s.task(WS_ID, CS_ID),
        "dead letters": s.dead_letter(WS_ID, CS_ID),
    }
    for name, subject in subjects.items():
        assert "" not in subject.split(".")
        assert not {"*", ">"} & set(subject.split("."))
        for stream, pattern in streams.items():
            assert _matches(pattern, subject) is (stream == name), (subject, pattern)
    assert _matches(s.tasks_filter, s.task(WS_ID, CS_ID))
    assert not _matches(s.tasks_filter, s.requests(WS_ID, CS_ID))
    # Streams of one deployment must not overlap, or the server refuses to create them.
    patterns = list(streams.values())
    for i, a in enumerate(patterns):
        for b in patterns[i + 1 :]:
            assert not _overlap(a, b), (a, b)


def test_deployments_with_different_prefixes_do_not_overlap() -> None:
    for a, b in [("P", "Q"), ("P", None), ("test-1", "test-2")]:
        sa, sb = Subjects(a), Subjects(b)
        for pa in (sa.requests_all, sa.tasks_all, sa.dead_letters_all):
            for pb in (sb.requests_all, sb.tasks_all, sb.dead_letters_all):
                assert not _overlap(pa, pb), (pa, pb)
        assert sa.requests_stream != sb.requests_stream


# -- prefixes ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [None, ""])
def test_no_prefix(prefix: str | None) -> None:
    assert validate_prefix(prefix) is None
    assert Subjects(prefix).prefix is None
    assert Subjects(prefix) == Subjects()


@pytest.mark.parametrize("prefix", ["P", "p", "test", "test-1", "a_b", "A-Z_0-9", "0"])
def test_valid_prefixes(prefix: str) -> None:
    assert validate_prefix(prefix) == prefix
    assert Subjects(prefix).prefix == prefix


BAD_PREFIXES = [
    "a.b",
    "a b",
    "*",
    ">",
    "a..b",
    ".",
    "a.",
    ".a",
    "a*",
    "a>",
    " a",
    "a\t",
    "a\n",
    "a/b",
    "é",
    "a$b",
]


@pytest.mark.parametrize("prefix", BAD_PREFIXES)
def test_invalid_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(InvalidSubject) as info:
        validate_prefix(prefix)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, RebaserError)
    with pytest.raises(InvalidSubject):
        Subjects(prefix)


# -- parsing ----------------------------------------------------------------------------------------------------


prefixes = st.none() | st.from_regex(r"[A-Za-z0-9_-]{1,16}", fullmatch=True)
ulids = st.integers(min_value=0, max_value=2**128 - 1).map(ULID.from_int)


@settings(max_examples=150, deadline=None, database=None)
@given(prefixes, ulids, ulids)
def test_parse_round_trips(prefix: str | None, wk: ULID, cs: ULID) -> None:
    s = Subjects(prefix)
    ws_id, cs_id = WorkspacePk(wk), ChangeSetId(cs)
    expected = ParsedSubject(ws_id, cs_id)
    assert s.parse_task(s.task(ws_id, cs_id)) == expected
    assert s.parse_requests(s.requests(ws_id, cs_id)) == expected
    parsed = s.parse_task(s.task(ws_id, cs_id))
    assert type(parsed.workspace_id) is WorkspacePk
    assert type(parsed.change_set_id) is ChangeSetId
    # A task subject leads to its change set's request subject and back.
    assert s.requests(parsed.workspace_id, parsed.change_set_id) == s.requests(ws_id, cs_id)


MALFORMED_TASKS = [
    "",
    "rebaser",
    "rebaser.tasks",
    f"rebaser.tasks.{WK}",
    f"rebaser.tasks.{WK}.{CS}",  # no trailing "process"
    f"rebaser.tasks.{WK}.{CS}.process.extra",
    f"rebaser.tasks.{WK}.{CS}.run",
    f"rebaser.task.{WK}.{CS}.process",
    f"rebaser.requests.{WK}.{CS}",
    f"Rebaser.tasks.{WK}.{CS}.process",
    f"rebaser.tasks.{CS}.process",
    f"rebaser.tasks.*.{CS}.process",
    f"rebaser.tasks.{WK}.*.process",
    f"rebaser.tasks.{WK}.>",
    f"rebaser.tasks.{WK}..process",
    f"rebaser.tasks.not-a-ulid.{CS}.process",
    f"rebaser.tasks.{WK}.{CS[:-1]}.process",
    f"rebaser.tasks.{WK}.8ZZZZZZZZZZZZZZZZZZZZZZZZZ.process",
    f".rebaser.tasks.{WK}.{CS}.process",
    f"P.rebaser.tasks.{WK}.{CS}.process",  # a prefix where none is expected
    f"dlq.rebaser.requests.{WK}.{CS}",
]

MALFORMED_REQUESTS = [
    "",
    "rebaser.requests",
    f"rebaser.requests.{WK}",
    f"rebaser.requests.{WK}.{CS}.process",
    f"rebaser.request.{WK}.{CS}",
    f"rebaser.tasks.{WK}.{CS}.process",
    f"rebaser.requests.{WK}.*",
    "rebaser.requests.>",
    f"rebaser.requests.{WK}.{CS}.",
    f"rebaser.requests.{WK}.{CS[:-1]}!",
    f"P.rebaser.requests.{WK}.{CS}",
    f"dlq.rebaser.requests.{WK}.{CS}",
]


@pytest.mark.parametrize("subject", MALFORMED_TASKS)
def test_malformed_task_subjects_are_refused(subject: str) -> None:
    with pytest.raises(InvalidSubject) as info:
        Subjects().parse_task(subject)
    assert isinstance(info.value, RebaserError)


@pytest.mark.parametrize("subject", MALFORMED_REQUESTS)
def test_malformed_request_subjects_are_refused(subject: str) -> None:
    with pytest.raises(InvalidSubject):
        Subjects().parse_requests(subject)


@pytest.mark.parametrize(
    "subject",
    [
        f"rebaser.tasks.{WK}.{CS}.process",  # prefix missing
        f"Q.rebaser.tasks.{WK}.{CS}.process",  # another prefix
        f"p.rebaser.tasks.{WK}.{CS}.process",  # prefixes are case-sensitive
        f"P.P.rebaser.tasks.{WK}.{CS}.process",
        f"P.rebaser.tasks.{WK}.{CS}",
        "P",
    ],
)
def test_prefixed_parser_refuses_subjects_without_its_prefix(subject: str) -> None:
    with pytest.raises(InvalidSubject):
        Subjects("P").parse_task(subject)


def test_prefixed_parsers_accept_their_own_subjects() -> None:
    s = Subjects("P")
    assert s.parse_task(f"P.rebaser.tasks.{WK}.{CS}.process") == ParsedSubject(WS_ID, CS_ID)
    assert s.parse_requests(f"P.rebaser.requests.{WK}.{CS}") == ParsedSubject(WS_ID, CS_ID)
    with pytest.raises(InvalidSubject):
        s.parse_requests(f"rebaser.requests.{WK}.{CS}")


@pytest.mark.parametrize("prefix", [None, "P"])
def test_stream_subjects_take_only_well_shaped_subjects(prefix: str | None) -> None:
    s = Subjects(prefix)
    assert _matches(s.requests_stream_subject, s.requests(WS_ID, CS_ID))
    assert _matches(s.tasks_stream_subject, s.task(WS_ID, CS_ID))
    head = f"{prefix}." if prefix else ""
    for junk in ("rebaser.requests.a", "rebaser.requests.a.b.c", "rebaser.requests.a.b.c.d.e"):
        assert not _matches(s.requests_stream_subject, head + junk)
    for junk in (
        "rebaser.tasks.a.b",
        "rebaser.tasks.a.b.c",
        "rebaser.tasks.a.b.c.process",
        "rebaser.tasks.a.b.x",
    ):
        assert not _matches(s.tasks_stream_subject, head + junk)
    assert _matches(s.dead_letters_all, s.dead_letter_malformed)
