"""docs/protocol.md §10, machine-checked: its worked example is sent byte for byte (headers and body as the document
prints them, plus the header-name spellings other client libraries use) to a live daemon with the built-in app, and
the replies must be the bytes the document shows.

Each case runs in a deployment of its own (a subject prefix, which the document's prefix rule allows): the example's
ids are fixed, and JetStream would drop a second request with the same ``Nats-Msg-Id`` as a duplicate.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from rebaser_server.apps.snapshots import SnapshotApp
from rebaser_server.testing import fast_settings, running_daemon

ROOT = Path(__file__).resolve().parents[3]
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def _section(number: int) -> str:
    text = (ROOT / "docs" / "protocol.md").read_text()
    start = text.index(f"\n## {number}. ")
    return text[start : text.index("\n## ", start + 1)]


def _blocks(number: int) -> list[tuple[str, str]]:
    return [(info.strip(), body.rstrip("\n")) for info, body in _FENCE.findall(_section(number))]


def _block(predicate: object, info: str | None = None) -> str:
    found = [b for i, b in _blocks(10) if (info is None or i == info) and predicate(b)]  # type: ignore[operator]
    assert len(found) == 1, found
    return found[0]


def _headers(block: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in block.splitlines())


REQUEST_HEADERS = _headers(_block(lambda b: b.startswith("X-CONTENT-TYPE") and "X-Reply-Inbox" in b))
REPLY_HEADERS = _headers(_block(lambda b: "EnqueueUpdatesResponse" in b and b.startswith("X-CONTENT-TYPE")))
SUBJECT = _block(lambda b: b.startswith("rebaser.requests."))
TASK_SUBJECT = _block(lambda b: b.startswith("rebaser.tasks."))
BODY_V3 = _block(lambda b: b.startswith('{"id"') and '"kind":"inline"' in b, "json")
BODY_V3_STORED = _block(lambda b: b.startswith('{"id"') and '"kind":"stored"' in b, "json")
BODY_V2 = _block(lambda b: '"updates_address"' in b and '"event_session_id"' in b, "json")
BODY_V1 = _block(lambda b: '"updates_address"' in b and '"event_session_id"' not in b, "json")
REPLY_CONFLICTS = _block(lambda b: '"kind":"conflicts"' in b, "json")
REPLY_V4 = _block(lambda b: "UnsupportedMessageVersion" in b, "json")
REPLY_V1 = _block(
    lambda b: '"kind":"refused"' in b and "01JAW0Q9A2C4E6G8J0M2P4R6T8 does not exist" in b, "json"
)
REPLY_STORED = _block(lambda b: '"kind":"error"' in b and "stored batch" in b, "json")


def _canonical(name: str) -> str:
    return "-".join(part.capitalize() for part in name.split("-"))


CASES = {
    # name: (headers, body, the reply the document shows)
    "as-documented": (REQUEST_HEADERS, BODY_V3, REPLY_CONFLICTS),
    "lower-case-names": ({k.lower(): v for k, v in REQUEST_HEADERS.items()}, BODY_V3, REPLY_CONFLICTS),
    "canonical-names": ({_canonical(k): v for k, v in REQUEST_HEADERS.items()}, BODY_V3, REPLY_CONFLICTS),
    "version-4": ({**REQUEST_HEADERS, "X-MESSAGE-VERSION": "4"}, BODY_V3, REPLY_V4),
    "v1": ({**REQUEST_HEADERS, "X-MESSAGE-VERSION": "1"}, BODY_V1, REPLY_V1),
    "v2": ({**REQUEST_HEADERS, "X-MESSAGE-VERSION": "2"}, BODY_V2, REPLY_V1),
    "v3-stored": (REQUEST_HEADERS, BODY_V3_STORED, REPLY_STORED),
}


def test_the_documented_body_is_what_the_document_says() -> None:
    assert f"and body ({len(BODY_V3.encode())} bytes of UTF-8" in _section(10)
    assert json.loads(BODY_V3) == json.loads(
        _block(lambda b: b.startswith("{\n"), "json")
    )  # the indented one


@pytest.mark.parametrize("case", list(CASES))
async def test_worked_example_byte_for_byte(nc: NatsClient, subject_prefix: str, case: str) -> None:
    headers, body, expected_reply = CASES[case]
    settings = fast_settings(subject_prefix)
    inbox = next(v for k, v in headers.items() if k.lower() == "x-reply-inbox")
    async with running_daemon(nc, settings, SnapshotApp()):
        sub = await nc.subscribe(inbox, max_msgs=1)
        ack = await nc.request(f"{subject_prefix}.{SUBJECT}", body.encode(), headers=headers, timeout=10)
        assert json.loads(ack.data) == {"stream": f"{subject_prefix}_REBASER_REQUESTS", "seq": 1}
        task_ack = json.loads((await nc.request(f"{subject_prefix}.{TASK_SUBJECT}", b"", timeout=10)).data)
        assert task_ack.get("stream") == f"{subject_prefix}_REBASER_TASKS", task_ack
        assert "error" not in task_ack or task_ack["error"]["err_code"] == 10077, task_ack
        reply = await sub.next_msg(timeout=20)
    # A refusal is the one status only version 2 carries (docs/protocol.md §5.2).
    version = "2" if '"kind":"refused"' in expected_reply else "1"
    assert dict(reply.headers or {}) == {**REPLY_HEADERS, "X-MESSAGE-VERSION": version}
    assert reply.data.decode() == expected_reply


def test_the_canonical_batch_example_of_section_14() -> None:
    from rebaser_core.api import SetLiteral
    from rebaser_core.batches import encode_batch

    _address, data = encode_batch([SetLiteral(path="/city", value="zürich")])
    assert f"is stored as\n`{data.decode()}`" in _section(14)


async def test_a_query_whose_id_is_not_a_ulid_is_answered_with_error(
    nc: NatsClient, subject_prefix: str
) -> None:
    settings = fast_settings(subject_prefix)
    wk, cs = "01JAW0Q7NB2K5Z8R4V6X9C3D1E", "01JAW0Q8F3T6M9P2S5V8Y1B4C7"
    query = {"id": "query-1", "workspace_id": wk, "change_set_id": cs, "path": None}
    headers = {
        "X-CONTENT-TYPE": "application/json",
        "X-MESSAGE-TYPE": "GetChangeSetRequest",
        "X-MESSAGE-VERSION": "1",
    }
    async with running_daemon(nc, settings, SnapshotApp()):
        reply = await nc.request(
            f"{subject_prefix}.rebaser.api.get.{wk}.{cs}",
            json.dumps(query).encode(),
            headers=headers,
            timeout=10,
        )
    assert reply.headers is not None
    assert (
        reply.headers["X-MESSAGE-TYPE"] == "GetChangeSetResponse"
        and reply.headers["X-MESSAGE-VERSION"] == "1"
    )
    answer = json.loads(reply.data)
    assert answer["error"].startswith("DecodeError: "), answer
    assert reply.headers["Nats-Msg-Id"] == answer["id"]
