"""``Delivery`` reads what nats-py's ``Msg.metadata`` reads from a JetStream reply subject, and refuses the same."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from rebaser_server.record.store import TaskDelivery
from rebaser_server.task.delivery import Delivery

_NUMBER = st.integers(min_value=0, max_value=2**64 - 1)
_NAME = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", min_size=1, max_size=12)


def _nats_py(reply: str) -> tuple[int, int, int, int]:
    meta = Msg.Metadata._from_reply(reply)
    stored_ns = round(meta.timestamp.timestamp() * 1e9)
    return meta.sequence.stream, meta.num_pending, stored_ns, meta.num_delivered


@given(_NAME, _NAME, _NUMBER, _NUMBER, _NUMBER, _NUMBER, _NUMBER)
def test_the_form_without_a_domain(
    stream: str, consumer: str, delivered: int, sseq: int, cseq: int, pending: int, ns: int
) -> None:
    ns %= 2**62  # a datetime (nats-py's timestamp) ends in the year 9999
    reply = f"$JS.ACK.{stream}.{consumer}.{delivered}.{sseq}.{cseq}.{ns}.{pending}"
    d = Delivery.parse(reply)
    assert (d.stream_seq, d.num_pending, d.stored_ns, d.delivered) == (sseq, pending, ns, delivered)
    assert d.consumer_seq == cseq
    got = _nats_py(reply)
    assert got[:2] == (sseq, pending) and got[3] == delivered
    assert abs(got[2] - ns) < 1_000  # nats-py keeps microseconds
    assert d.stored_at == pytest.approx(ns / 1e9)


@pytest.mark.parametrize("tail", ["", ".random"])
@pytest.mark.parametrize("domain", ["_", "hub"])
def test_the_form_with_a_domain(domain: str, tail: str) -> None:
    reply = f"$JS.ACK.{domain}.ACCHASH.REQUESTS.c1.3.1234.17.1700000000123456789.42{tail}"
    d = Delivery.parse(reply)
    assert (d.stream_seq, d.num_pending, d.stored_ns, d.delivered) == (1234, 42, 1700000000123456789, 3)
    assert d.consumer_seq == 17
    assert _nats_py(reply)[:2] == (1234, 42) and _nats_py(reply)[3] == 3


@pytest.mark.parametrize(
    "reply",
    [
        None,
        "",
        "_INBOX.abc.1",  # a reply subject, but no delivery's
        "$JS.ACK.S.C.1.2.3.4",  # one token short
        "$JS.ACK.S.C.1.2.3.4.5.6",  # ten tokens: neither form
        "$JS.NAK.S.C.1.2.3.4.5",
        "$KV.ACK.S.C.1.2.3.4.5",
    ],
)
def test_what_is_no_delivery_is_refused_as_nats_py_refuses_it(reply: str | None) -> None:
    with pytest.raises(NotJSMessageError):
        Delivery.parse(reply)
    with pytest.raises(NotJSMessageError):
        Msg.Metadata._from_reply(reply)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.S.C.one.2.3.4.5",  # the delivered count
        "$JS.ACK.S.C.1.two.3.4.5",  # the stream sequence
        "$JS.ACK.S.C.1.2.three.4.5",  # the consumer sequence
        "$JS.ACK.S.C.1.2.3.four.5",  # the stored-at time
        "$JS.ACK.S.C.1.2.3.4.five",  # pending
        "$JS.ACK._.HASH.S.C.1.2.x.4.5",  # the form with a domain
    ],
)
def test_words_where_numbers_belong_are_refused(reply: str) -> None:
    with pytest.raises(ValueError):
        Delivery.parse(reply)
    with pytest.raises(ValueError):
        Msg.Metadata._from_reply(reply)


def test_of_reads_the_message_reply() -> None:
    msg = Msg(_client=None, subject="x", reply="$JS.ACK.S.C.1.9.3.4.0")  # type: ignore[arg-type]
    assert Delivery.of(msg).stream_seq == 9
    assert Delivery.of(msg).num_pending == 0


@given(_NUMBER, _NUMBER)
def test_a_task_delivery_is_read_as_nats_py_reads_it(delivered: int, sseq: int) -> None:
    reply = f"$JS.ACK.TASKS.c.{delivered}.{sseq}.7.1700000000123456789.0"
    msg = Msg(_client=None, subject="t", reply=reply)  # type: ignore[arg-type]
    meta = msg.metadata
    assert TaskDelivery.of(msg) == TaskDelivery(meta.sequence.stream, meta.num_delivered)


def test_the_stream_and_consumer_a_delivery_subject_names() -> None:
    assert Delivery.names("$JS.ACK.REQUESTS.c1.1.2.3.4.5") == ("REQUESTS", "c1")
    assert Delivery.names("$JS.ACK.hub.ACCHASH.REQUESTS.c1.3.1234.17.1700000000123456789.42.tok") == (
        "REQUESTS",
        "c1",
    )
    assert Delivery.names("$JS.ACK.S.C.1.2.3.4") is None
