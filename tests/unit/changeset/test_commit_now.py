"""When a commit group is carried out (``rebaser_server.changeset.group.commit_now``), without a server."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rebaser_server.changeset.group import GROUP_MAX, commit_now


def test_a_group_with_nothing_waiting_behind_it_is_committed_now() -> None:
    assert commit_now(1, 0, one_by_one=False, idempotency_window=64)
    assert commit_now(5, 0, one_by_one=False, idempotency_window=64)


def test_a_group_grows_while_requests_wait_behind_it() -> None:
    assert not commit_now(1, 1, one_by_one=False, idempotency_window=64)
    assert not commit_now(GROUP_MAX - 1, 100, one_by_one=False, idempotency_window=1024)


def test_a_full_group_is_committed_even_with_more_waiting() -> None:
    assert commit_now(GROUP_MAX, 100, one_by_one=False, idempotency_window=1024)
    assert commit_now(GROUP_MAX + 3, 100, one_by_one=False, idempotency_window=1024)


def test_a_group_is_capped_at_half_the_idempotency_window() -> None:
    # A window of 16 keeps groups to 8 requests: every processed request still in the stream stays remembered.
    assert not commit_now(7, 10, one_by_one=False, idempotency_window=16)
    assert commit_now(8, 10, one_by_one=False, idempotency_window=16)
    assert commit_now(4, 10, one_by_one=False, idempotency_window=9)  # 9 // 2


def test_after_an_unclean_takeover_every_request_is_committed_on_its_own() -> None:
    assert commit_now(1, 50, one_by_one=True, idempotency_window=64)


@given(
    size=st.integers(min_value=1, max_value=200),
    waiting=st.integers(min_value=1, max_value=200),
    window=st.integers(min_value=8, max_value=4096),
)
def test_a_group_never_outgrows_its_cap_and_a_committed_size_stays_committed(
    size: int, waiting: int, window: int
) -> None:
    now = commit_now(size, waiting, one_by_one=False, idempotency_window=window)
    if now:  # a larger group with as many waiting is committed too
        assert commit_now(size + 1, waiting, one_by_one=False, idempotency_window=window)
    if size >= GROUP_MAX or size >= window // 2:
        assert now
    else:  # below both caps, with requests waiting, the group grows
        assert not now
