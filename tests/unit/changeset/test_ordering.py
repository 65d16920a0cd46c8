"""The ordered consumer's bookkeeping (``rebaser_server/changeset/ordering.py``), without a server."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rebaser_server.changeset.ordering import GAP, MISSED_HEARTBEATS, STALE, TAKEN, FlowReplies, Sequences


def test_deliveries_in_order_are_taken_and_a_skip_is_not() -> None:
    seq = Sequences(now=0.0)
    assert seq.take(1, 10, 0.0) == TAKEN and seq.take(2, 11, 0.0) == TAKEN
    assert seq.take(4, 13, 0.0) == GAP  # consumer sequence 3 was lost
    assert (seq.expected, seq.last_stream_seq) == (3, 11)
    assert seq.take(2, 11, 0.0) == GAP  # a repeat is not taken either


def test_the_next_consumer_sequence_with_an_earlier_stream_sequence_is_dropped() -> None:
    """Not the server's (its stream sequences only grow): neither taken nor a reason to reset, and the restart
    point stays where the server's deliveries put it."""
    seq = Sequences(now=0.0)
    seq.take(1, 10, 0.0)
    assert seq.take(2, 10, 0.0) == STALE and seq.take(2, 3, 0.0) == STALE
    assert (seq.expected, seq.last_stream_seq) == (2, 10)
    assert seq.take(2, 12, 0.0) == TAKEN


def test_a_restart_starts_after_the_last_stream_sequence_taken() -> None:
    seq = Sequences(now=0.0)
    seq.take(1, 10, 0.0)
    seq.take(2, 15, 0.0)
    fresh = seq.restart(5.0)
    assert (fresh.expected, fresh.last_stream_seq, fresh.last_seen) == (1, 15, 5.0)
    assert fresh.take(1, 16, 5.0) == TAKEN


@given(st.lists(st.booleans(), min_size=1, max_size=60))
def test_whatever_is_lost_every_stream_sequence_is_taken_once_in_order(losses: list[bool]) -> None:
    """Replay a stream 1..N through consumers that lose the deliveries ``losses`` marks (one flag per delivery
    sent) and are replaced after each gap, or after the idle heartbeat that ends each pass: the stream sequences
    taken are exactly 1..N, in order."""
    stream = list(range(1, 21))
    taken: list[int] = []
    flags = iter(losses)
    seq = Sequences(now=0.0)
    while len(taken) < len(stream):
        sent = 0
        for stream_seq in stream[seq.last_stream_seq :]:
            sent += 1
            if next(flags, False):
                continue  # lost on the way
            if seq.take(sent, stream_seq, 0.0) != TAKEN:
                break
            taken.append(stream_seq)
        else:
            if seq.heartbeat(sent, 0.0):
                continue
        seq = seq.restart(0.0)
    assert taken == stream


def test_a_heartbeat_must_name_the_last_delivery_taken() -> None:
    seq = Sequences(now=0.0)
    assert seq.heartbeat(0, 1.0) and seq.heartbeat(None, 1.0)
    seq.take(1, 7, 1.0)
    assert seq.heartbeat(1, 2.0)
    assert not seq.heartbeat(2, 2.0)  # one sent and never taken: lost at the tail
    assert not seq.heartbeat(0, 2.0)  # one taken that the server never sent: forged
    assert seq.last_seen == 2.0


def test_silence_is_two_missed_heartbeats_and_a_little() -> None:
    seq = Sequences(now=100.0)
    assert not seq.silent(100.0 + MISSED_HEARTBEATS * 5.0, 5.0)
    assert seq.silent(100.0 + (MISSED_HEARTBEATS + 1) * 5.0, 5.0)
    seq.heartbeat(None, 112.0)
    assert not seq.silent(115.0, 5.0)


def test_a_flow_control_reply_waits_for_the_deliveries_before_it() -> None:
    flow = FlowReplies()
    assert flow.request("fc.0")  # nothing received: answer now
    flow.received = 3
    assert not flow.request("fc.1")
    assert flow.holds("fc.1") and len(flow) == 1
    assert flow.done() is None and flow.done() is None
    assert flow.done() == "fc.1"  # the third handled
    assert len(flow) == 0 and flow.done() is None
    flow.received = 4
    assert flow.request("fc.2")  # all four handled by now: answered at once


def test_one_reply_is_held_the_newer_one() -> None:
    """The server has one request outstanding per consumer: a newer one replaces what is held, so however many
    requests come (forged ones too) one is held, due once every delivery received before it is handled."""
    flow = FlowReplies()
    flow.received = 2
    for i in range(1000):
        assert not flow.request(f"fc.{i}")
    flow.received = 4
    assert not flow.request("fc.last")
    assert len(flow) == 1 and not flow.holds("fc.0")
    assert [flow.done() for _ in range(4)] == [None, None, None, "fc.last"]


def test_forget_drops_what_is_held() -> None:
    flow = FlowReplies()
    flow.received = 2
    flow.request("fc.1")
    flow.forget()
    assert not flow.holds("fc.1")
    assert flow.done() is None and flow.done() is None
