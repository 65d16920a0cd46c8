"""Golden wire fixtures: committed bytes that every future version of the code must keep reading.

Each fixture in ``golden/`` is a body plus its headers as some past (or the present) sender put them on the wire.
The receiver must negotiate from the headers, decode, upgrade to the current version and get exactly the
committed ``*.expected.json``; and encoding the same version again must give the very same bytes.

These files are never regenerated here (see ``make_golden.py``, run by hand). A failure means the wire format
changed: old senders, stored requests and peers in other languages would break.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rebaser_core import headers as h
from rebaser_core.api import (
    ENQUEUE_UPDATES_REQUEST,
    ENQUEUE_UPDATES_RESPONSE,
    ContentType,
    MessageVersion,
    VersionedMessage,
)

GOLDEN = Path(__file__).resolve().parent / "golden"

REGISTRIES: dict[str, VersionedMessage[Any]] = {
    ENQUEUE_UPDATES_REQUEST.name: ENQUEUE_UPDATES_REQUEST,
    ENQUEUE_UPDATES_RESPONSE.name: ENQUEUE_UPDATES_RESPONSE,
}
EXTENSIONS = {"cbor": ContentType.CBOR, "json": ContentType.JSON}

# Every fixture that must exist. Add new ones (new versions, new variants); never remove or rename one.
EXPECTED_STEMS = (
    "EnqueueUpdatesRequest.v1",
    "EnqueueUpdatesRequest.v2",
    "EnqueueUpdatesRequest.v3.inline",
    "EnqueueUpdatesRequest.v3.stored",
    "EnqueueUpdatesResponse.v1.success",
    "EnqueueUpdatesResponse.v1.conflicts",
    "EnqueueUpdatesResponse.v1.error",
    "EnqueueUpdatesResponse.v2.refused",
    "EnqueueUpdatesResponse.v3.error_details",
)
EXPECTED_BODIES = sorted(f"{stem}.{ext}" for stem in EXPECTED_STEMS for ext in EXTENSIONS)


def _body_files() -> list[str]:
    if not GOLDEN.is_dir():
        return []
    return sorted(
        p.name
        for p in GOLDEN.iterdir()
        if p.suffix in (".cbor", ".json") and not p.name.endswith((".headers.json", ".expected.json"))
    )


BODIES = _body_files()


def _load(name: str) -> tuple[dict[str, str], bytes, Any]:
    body = (GOLDEN / name).read_bytes()
    headers = json.loads((GOLDEN / f"{name}.headers.json").read_text(encoding="utf-8"))
    expected = json.loads((GOLDEN / f"{name}.expected.json").read_text(encoding="utf-8"))
    assert isinstance(headers, dict)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
    return headers, body, expected


def _registry(headers: dict[str, str]) -> VersionedMessage[Any]:
    return REGISTRIES[headers[h.MESSAGE_TYPE]]


def test_every_fixture_is_present() -> None:
    assert BODIES == EXPECTED_BODIES
    for name in EXPECTED_BODIES:
        assert (GOLDEN / f"{name}.headers.json").is_file(), name
        assert (GOLDEN / f"{name}.expected.json").is_file(), name


def test_every_version_of_every_message_has_fixtures_in_both_codecs() -> None:
    covered: set[tuple[str, int, ContentType]] = set()
    for name in BODIES:
        headers, _, _ = _load(name)
        negotiated = _registry(headers).negotiate(headers)
        covered.add((headers[h.MESSAGE_TYPE], negotiated.version, negotiated.content_type))
    wanted = {
        (registry.name, version, content_type)
        for registry in REGISTRIES.values()
        for version in registry.versions
        for content_type in ContentType
    }
    assert wanted <= covered, f"versions without a golden fixture: {sorted(wanted - covered)}"


@pytest.mark.parametrize("name", BODIES)
def test_fixture_decodes_and_upgrades_to_the_expected_current_message(name: str) -> None:
    headers, body, expected = _load(name)
    registry = _registry(headers)

    negotiated = registry.negotiate(headers)
    assert negotiated.content_type is EXTENSIONS[name.rsplit(".", 1)[1]]
    assert f".v{negotiated.version}" in name

    old = registry.decode_version(body, negotiated)
    assert type(old) is registry.version_class(negotiated.version)
    assert headers[h.NATS_MSG_ID] == str(old.id)

    current = registry.upgrade(old)
    assert type(current) is registry.current
    assert current.model_dump(mode="json") == expected
    assert registry.current.model_validate(expected) == current
    # The one-call path gives the same answer as the step-by-step one.
    assert registry.decode(headers, body) == current


@pytest.mark.parametrize("name", BODIES)
def test_encoding_the_same_version_again_reproduces_the_committed_bytes(name: str) -> None:
    headers, body, _ = _load(name)
    registry = _registry(headers)
    negotiated = registry.negotiate(headers)
    message: MessageVersion = registry.decode_version(body, negotiated)

    new_headers, new_body = registry.encode(
        message, negotiated.content_type, reply_inbox=headers.get(h.REPLY_INBOX)
    )

    assert new_body == body
    assert new_headers == headers


@pytest.mark.parametrize("stem", EXPECTED_STEMS)
def test_both_codecs_of_a_fixture_carry_the_same_message(stem: str) -> None:
    decoded = []
    for ext in EXTENSIONS:
        headers, body, expected = _load(f"{stem}.{ext}")
        decoded.append((_registry(headers).decode(headers, body), expected))
    (cbor_message, cbor_expected), (json_message, json_expected) = decoded
    assert cbor_message == json_message
    assert cbor_expected == json_expected
