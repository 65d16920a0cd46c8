"""How the trimmer reads the answer to a delete of a processed request
(rebaser_server.changeset.trimmer._delete_error)."""

from __future__ import annotations

import json

import nats.errors
import pytest
from nats.aio.msg import Msg
from nats.js.errors import APIError

from rebaser_server.changeset.trimmer import _delete_error


def answer(data: bytes) -> Msg:
    return Msg(_client=None, subject="_INBOX.x.1", data=data)  # type: ignore[arg-type]


def error(code: int, err_code: int, description: str) -> bytes:
    return json.dumps({"error": {"code": code, "err_code": err_code, "description": description}}).encode()


def test_deleted_and_already_gone_are_both_done() -> None:
    assert (
        _delete_error(
            answer(b'{"type":"io.nats.jetstream.api.v1.stream_msg_delete_response","success":true}')
        )
        is None
    )
    assert _delete_error(answer(error(400, 10043, "sequence 2 not found"))) is None  # memory store
    assert _delete_error(answer(error(500, 10057, "no message found"))) is None  # file store
    assert _delete_error(answer(error(500, 10057, "stream store EOF"))) is None


@pytest.mark.parametrize(
    "data",
    [
        error(503, 10039, "jetstream not enabled for account"),
        error(500, 10057, "some other storage failure"),
        b'{"success":false}',
        b"not json",
        b"[]",
    ],
)
def test_anything_else_is_a_failure(data: bytes) -> None:
    failure = _delete_error(answer(data))
    assert isinstance(failure, APIError | ValueError)


def test_no_answer_is_a_failure() -> None:
    timeout = nats.errors.TimeoutError()
    assert _delete_error(timeout) is timeout
