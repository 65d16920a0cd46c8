"""The operators' audit trail: every action of the web console and of the ``rebaser`` commands (pause, resume, skip,
replay, drop, the repairs), recorded as one JSON message in a small JetStream stream an operator can list
(``rebaser audit``, the console's ``/audit`` page).

The stream (``[P_]REBASER_AUDIT``, subjects ``[P.]rebaser.audit.<action>``:
:func:`rebaser_core.nats.streams.audit_stream_config`) keeps the newest entries only: limits retention, discard old,
bounded by age, count and size. The daemons create it with their other streams (an operator's NATS user may not
create streams); a writer that finds none (daemons older than it) creates it, with the storage and replicas of the
dead-letter stream.

An action never depends on its record: :func:`record` is called once the action is done, and a record that cannot be
written (NATS refuses it, the stream is full, the account may not publish there) returns why instead of raising; the
action's caller says the entry is missing (:func:`missing_line`).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import re
import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.js import api as js_api
from nats.js.errors import BadRequestError, NoStreamResponseError, NotFoundError

from rebaser_client._jetstream import OPERATOR_TIMEOUT, js_error
from rebaser_core.nats.streams import AUDIT_MAX_MSG, audit_stream_config
from rebaser_core.subjects import Subjects

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient

__all__ = [
    "LIST_MAX",
    "AuditEntry",
    "cli_identity",
    "entries",
    "make_entry",
    "missing_line",
    "record",
]

LIST_MAX = 10_000  # entries one listing reads at most
_TARGETS = 50
_LINES = 20
_LINE = 300
_TOKEN = re.compile(r"[^A-Za-z0-9_-]+")

AuditEntry = dict[str, Any]


def cli_identity() -> str:
    """Who runs a ``rebaser`` command: ``os:<user>@<host>`` (the operating system's user name, as the process
    sees it; ``unknown`` where it cannot be read)."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in the environment nor in the password database
        user = "unknown"
    return f"os:{user}@{socket.gethostname()}"


def make_entry(
    *,
    who: str,
    source: str,
    what: str,
    targets: Sequence[str] = (),
    outcome: str,
    lines: Sequence[str] = (),
    **extra: Any,
) -> AuditEntry:
    """One entry: when, who, from where (``source``: ``cli`` or ``console``), what, which targets, the outcome
    (``ok``, ``failed``, ``refused``) and what the operator was told."""
    targets = list(targets)
    entry: AuditEntry = {
        "at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "who": who,
        "source": source,
        "what": what,
        "targets": targets[:_TARGETS]
        + ([f"... and {len(targets) - _TARGETS} more"] if len(targets) > _TARGETS else []),
        "outcome": outcome,
        "lines": [line[:_LINE] for line in list(lines)[:_LINES]],
    }
    entry.update({k: v for k, v in extra.items() if v is not None})
    return entry


def missing_line(why: str) -> str:
    """What an action's caller says when its record could not be written: the action is done all the same."""
    return f"the audit entry is missing (the action is done all the same): {why}"


async def _create(nc: NatsClient, subjects: Subjects) -> None:
    """Create the audit stream like the dead-letter stream (its storage, its replicas); another writer may have
    created it meanwhile."""
    js = nc.jetstream(timeout=OPERATOR_TIMEOUT)
    storage, replicas = js_api.StorageType.FILE, 1
    with contextlib.suppress(NotFoundError, nats.errors.Error, TimeoutError):
        info = await js.stream_info(subjects.dead_letter_stream)
        storage = info.config.storage or storage
        replicas = info.config.num_replicas or replicas
    with contextlib.suppress(BadRequestError):  # created concurrently: publish below
        await js.add_stream(audit_stream_config(subjects, storage=storage, replicas=replicas))


async def record(nc: NatsClient, subjects: Subjects, entry: AuditEntry) -> str | None:
    """Store ``entry`` in the audit stream (created if it does not exist); None once stored, else why not. Never
    raises for NATS: the action it records is done, and stays done."""
    action = _TOKEN.sub("-", str(entry.get("what") or "action").split(" ")[0]).strip("-")[:64] or "action"
    data = json.dumps(entry, separators=(",", ":")).encode()
    if len(data) > AUDIT_MAX_MSG:
        entry = {
            **entry,
            "lines": [line[:80] for line in entry.get("lines", [])[:5]],
            "targets": entry["targets"][:10],
        }
        data = json.dumps(entry, separators=(",", ":")).encode()
    js = nc.jetstream(timeout=OPERATOR_TIMEOUT)
    try:
        for attempt in (1, 2):
            try:
                await js.publish(subjects.audit(action), data)
                return None
            except NoStreamResponseError:
                if attempt == 2:
                    raise
                await _create(nc, subjects)
    except Exception as err:  # whatever it is, the action stands: say why its record is missing
        return f"{type(err).__name__}: {err}".rstrip(": ") or type(err).__name__
    return None  # pragma: no cover (the loop returns or raises)


async def entries(nc: NatsClient, subjects: Subjects, *, limit: int = 50) -> tuple[int, list[AuditEntry]]:
    """(how many entries the stream holds, the newest ``limit`` of them, newest first). None recorded yet: (0, [])."""
    js = nc.jetstream(timeout=OPERATOR_TIMEOUT)
    limit = max(0, min(limit, LIST_MAX))
    found: list[AuditEntry] = []
    try:
        try:
            info = await js.stream_info(subjects.audit_stream)
        except NotFoundError:
            return 0, []
        total, first, last = int(info.state.messages), int(info.state.first_seq), int(info.state.last_seq)
        seq = last
        while seq >= max(first, 1) and len(found) < limit:
            try:
                msg = await js.get_msg(subjects.audit_stream, seq=seq, direct=True)
            except NotFoundError:  # gone meanwhile (aged out, or deleted)
                seq -= 1
                continue
            try:
                entry = json.loads(msg.data or b"")
            except ValueError:
                entry = {"what": "(not an audit entry)", "lines": [repr((msg.data or b"")[:200])]}
            if isinstance(entry, dict):
                entry["seq"] = seq
                found.append(entry)
            seq -= 1
    except (TimeoutError, nats.errors.Error) as err:
        raise js_error(err, subjects) from None
    return total, found
