"""Write the golden wire fixtures in ``tests/contract/golden/``. Run by hand, never by pytest.

    PYTHONPATH=. python tests/contract/make_golden.py            # write missing fixtures, refuse to change any
    PYTHONPATH=. python tests/contract/make_golden.py --check    # only compare; exit 1 on any difference
    PYTHONPATH=. python tests/contract/make_golden.py --force    # overwrite fixtures that differ

The golden files are *committed bytes*: ``test_golden.py`` reads them and never calls this script. A fixture that
no longer matches what the code produces is a wire-format change, so overwriting one needs ``--force`` and a
reason in the commit message. Adding a message version means adding its fixtures here (and to the list in
``test_golden.py``), never changing the old ones.

For every fixture ``<Type>.v<N>[.<variant>]`` and codec (``cbor``, ``json``) it writes:

- ``<name>.<codec>``               the body, exactly as ``VersionedMessage.encode`` produces it;
- ``<name>.<codec>.headers.json``  the headers that go with it;
- ``<name>.<codec>.expected.json`` the message after upgrading to the current version, ``model_dump(mode="json")``.

Every id is a fixed, hard-coded ULID so the bytes never change from one run to the next.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

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

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
CODECS = {"cbor": ContentType.CBOR, "json": ContentType.JSON}
REPLY_INBOX = "_INBOX.golden.4f2c9a"

# Fixed ids: never replace them with fresh ones, or every fixture changes.
WORKSPACE = WorkspacePk("01JAW0Q7NB2K5Z8R4V6X9C3D1E")
CHANGE_SET = ChangeSetId("01JAW0Q8F3T6M9P2S5V8Y1B4C7")
FROM_CHANGE_SET = ChangeSetId("01JAW0Q9A2C4E6G8J0M2P4R6T8")
REQUEST_V1 = RequestId("01JAW0QA6H9K2N5Q8T1W4Z7C0F")
REQUEST_V2 = RequestId("01JAW0QB3D5F7H9K1M3P5R7T9V")
REQUEST_V3_INLINE = RequestId("01JAW0QC8E0G2J4M6P8S0V2X4Z")
REQUEST_V3_STORED = RequestId("01JAW0QD1F3H5K7N9Q1S3V5X7Z")
RESPONSE_SUCCESS = REQUEST_V3_INLINE  # a reply carries the id of the request it answers
RESPONSE_CONFLICTS = RequestId("01JAW0QE4G6J8M0P2R4T6W8Y0A")
RESPONSE_ERROR = RequestId("01JAW0QF7H9K1N3Q5S7V9X1Z3B")
RESPONSE_REFUSED = RequestId("01JAW0QG2J4M6P8R0T2W4Y6A8C")
RESPONSE_ERROR_DETAILS = RequestId("01JAW0QH5K7N9Q1S3V5X7Z9B1D")


@dataclass(frozen=True)
class Fixture:
    name: str
    registry: VersionedMessage[MessageVersion]
    message: MessageVersion
    reply_inbox: str | None


def fixtures() -> list[Fixture]:
    request: VersionedMessage[MessageVersion] = ENQUEUE_UPDATES_REQUEST  # type: ignore[assignment]
    response: VersionedMessage[MessageVersion] = ENQUEUE_UPDATES_RESPONSE  # type: ignore[assignment]
    return [
        Fixture(
            "EnqueueUpdatesRequest.v1",
            request,
            EnqueueUpdatesRequestV1(
                id=REQUEST_V1,
                workspace_id=WORKSPACE,
                change_set_id=CHANGE_SET,
                updates_address="sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                from_change_set_id=FROM_CHANGE_SET,
            ),
            REPLY_INBOX,
        ),
        Fixture(
            "EnqueueUpdatesRequest.v2",
            request,
            EnqueueUpdatesRequestV2(
                id=REQUEST_V2,
                workspace_id=WORKSPACE,
                change_set_id=CHANGE_SET,
                updates_address="sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752",
                from_change_set_id=FROM_CHANGE_SET,
                event_session_id="session-7c1d",
            ),
            REPLY_INBOX,
        ),
        Fixture(
            "EnqueueUpdatesRequest.v3.inline",
            request,
            EnqueueUpdatesRequestV3(
                id=REQUEST_V3_INLINE,
                workspace_id=WORKSPACE,
                change_set_id=CHANGE_SET,
                updates=InlineUpdates(
                    updates=[
                        SetLiteral(
                            path="/components/web/config",
                            value={
                                "port": 8080,
                                "ratio": 0.75,
                                "scale": -1.5e-7,
                                "big": 9007199254740993,
                                "enabled": True,
                                "owner": None,
                                "tags": ["prod", "zürich", "日本", "🚀"],
                                "nested": {
                                    "empty_list": [],
                                    "empty_map": {},
                                    "mixed": [1, "two", 3.5, False],
                                },
                            },
                        ),
                        SetFunction(
                            path="/components/web/url",
                            function="concat",
                            args=["/components/web/host", "/components/web/config/port"],
                            expected_version="7",
                        ),
                        Remove(path="/components/legacy-proxy", expected_version="12"),
                    ]
                ),
                from_change_set_id=FROM_CHANGE_SET,
                event_session_id="session-7c1d",
            ),
            REPLY_INBOX,
        ),
        Fixture(
            "EnqueueUpdatesRequest.v3.stored",
            request,
            EnqueueUpdatesRequestV3(
                id=REQUEST_V3_STORED,
                workspace_id=WORKSPACE,
                change_set_id=CHANGE_SET,
                updates=StoredUpdates(
                    address="sha256:fd61a03af4f77d870fc21e05e7e80678095c92d808cfb3b5c279ee04c74aca13"
                ),
            ),
            REPLY_INBOX,
        ),
        Fixture(
            "EnqueueUpdatesResponse.v1.success",
            response,
            EnqueueUpdatesResponseV1(
                id=RESPONSE_SUCCESS,
                workspace_id=WORKSPACE,
                change_set_id=CHANGE_SET,
                status=SuccessStatus(
                    updates_performed=3, snapshot_address="snapshots/01JAW0Q8F3T6M9P2S5V8Y1B4C7/42"
                ),
            ),
            None,
        ),
        Fixture(
            "EnqueueUpdatesResponse.v1.conflicts",
            response,
            EnqueueUpdatesResponseV1(
                id=RESPONSE_CONFLICTS,
                workspace_id=WORKSPACE,
                change_set_id=CHANGE_SET,
                status=ConflictsStatus(
                    conflicts=[
                        Conflict(
                            path="/components/web/url",
                            expected_version="7",
                            actual_version="8",
                            message="changed since the batch was computed",
                        ),
                        Conflict(path="/components/legacy-proxy", expected_version="12", actual_version=None),
                    ]
                ),
            ),
            None,
        ),
        Fixture(
            "EnqueueUpdatesResponse.v1.error",
            response,
            EnqueueUpdatesResponseV1(
                id=RESPONSE_ERROR,
                workspace_id=WORKSPACE,
                change_set_id=CHANGE_SET,
                status=ErrorStatus(
                    message="function 'concat' failed: argument 2 is not a string — é", retryable=True
                ),
            ),
            None,
        ),
        Fixture(
            "EnqueueUpdatesResponse.v2.refused",
            response,
            EnqueueUpdatesResponseV2(
                id=RESPONSE_REFUSED,
                workspace_id=WORKSPACE,
                change_set_id=CHANGE_SET,
                status=RefusedStatus(
                    message="quantity must be at least 1 — got 0",
                    details={"field": "quantity", "minimum": 1, "got": 0},
                ),
            ),
            None,
        ),
        Fixture(
            "EnqueueUpdatesResponse.v3.error_details",
            response,
            EnqueueUpdatesResponseV3(
                id=RESPONSE_ERROR_DETAILS,
                workspace_id=WORKSPACE,
                change_set_id=CHANGE_SET,
                status=ErrorStatus(
                    message="gave up after 3 attempts: KeyError: 'price' (at ledger.py:42 in apply)",
                    details=ErrorDetails(error_class="KeyError", raised_at="ledger.py:42 in apply"),
                ),
            ),
            None,
        ),
    ]


def render(fixture: Fixture, content_type: ContentType) -> tuple[bytes, bytes, bytes]:
    """Body, headers file and expected file of one fixture in one codec."""
    headers, body = fixture.registry.encode(fixture.message, content_type, reply_inbox=fixture.reply_inbox)
    current = fixture.registry.upgrade(fixture.message)
    headers_file = (json.dumps(headers, indent=2) + "\n").encode()
    expected_file = (
        json.dumps(current.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"
    ).encode()
    return body, headers_file, expected_file


def planned() -> dict[Path, bytes]:
    files: dict[Path, bytes] = {}
    for fixture in fixtures():
        for ext, content_type in CODECS.items():
            body, headers_file, expected_file = render(fixture, content_type)
            base = GOLDEN_DIR / f"{fixture.name}.{ext}"
            files[base] = body
            files[base.with_name(base.name + ".headers.json")] = headers_file
            files[base.with_name(base.name + ".expected.json")] = expected_file
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare only; exit 1 if anything differs")
    mode.add_argument("--force", action="store_true", help="overwrite fixtures whose bytes differ")
    args = parser.parse_args(argv)

    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    missing: list[Path] = []
    changed: list[Path] = []
    plan = planned()
    for path, content in plan.items():
        if not path.exists():
            missing.append(path)
        elif path.read_bytes() != content:
            changed.append(path)

    for path in missing:
        print(f"{'missing' if args.check else 'created'}: {path.name}")
        if not args.check:
            path.write_bytes(plan[path])
    for path in changed:
        if args.force:
            print(f"OVERWRITTEN: {path.name}")
            path.write_bytes(plan[path])
        else:
            print(f"DIFFERS (wire format changed?): {path.name}")

    if args.check:
        return 1 if missing or changed else 0
    if changed and not args.force:
        print("refusing to overwrite committed golden bytes; rerun with --force if the change is intended")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
