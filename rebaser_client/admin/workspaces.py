"""Per workspace, for ``rebaser status``: how many change sets the daemons own and how many wait for an owner.

Where each figure comes from, chosen to stay cheap with thousands of change sets:

- **tasks**: change sets with a task in the tasks streams (owned by a daemon, or waiting for one), and **queued**:
  requests in the requests streams. Both come from the subject counts ``status_report`` reads anyway (one stream info
  with ``subjects_filter`` per stream and shard); no call per change set.
- **owned**: what the daemons say they own, from each one's ``/status`` (``owned.by_workspace``: its ten busiest
  workspaces), read over HTTP when the operator names the daemons (``--daemon-url``). The streams cannot tell it:
  a task handed back for fairness (a delayed nak) is as delivered as an owned one until it comes back.
- **waiting**: tasks not owned, ``tasks - owned`` (queued behind the others, or handed back for fairness).
- **served**: the workspace's part of the tasks the daemons read took lately (each daemon's
  ``owned.served_by_workspace`` over its ``served_total``, summed: a task taken counts half as much every minute).

Blocking and standard-library only for the HTTP part (run in a thread), like :mod:`rebaser_core.nats.monitoring`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "WORKSPACES_LISTED",
    "DaemonLine",
    "DaemonsOwned",
    "WorkspaceLine",
    "busiest_workspaces",
    "read_daemons_owned",
]

# Workspaces listed by ``rebaser status`` (the busiest first); all are counted.
WORKSPACES_LISTED = 10
# One daemon's /status is read within this long, or counts as not read.
READ_TIMEOUT = 2.0
# A /status document is tens of KiB at most: a larger answer is not a daemon's, and is not read further.
_MAX_STATUS_BYTES = 4 * 1024 * 1024
# No proxy from the environment: a daemon's health endpoint is reached directly.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class WorkspaceLine:
    workspace_id: str
    tasks: int  # change sets with a task: owned by a daemon or waiting for one
    queued: int  # requests in the requests streams (processed ones not yet removed included)
    owned: int | None  # change sets the daemons read own (None: no daemon was read)
    served: float | None = None  # its part of the tasks taken lately, 0 to 1 (None: no daemon said)

    @property
    def waiting(self) -> int | None:
        """Tasks no daemon owns (None: unknown, no daemon was read)."""
        return None if self.owned is None else max(0, self.tasks - self.owned)


@dataclass(frozen=True)
class DaemonLine:
    """One daemon as its ``/status`` describes it (the web console's overview lists them)."""

    url: str
    owner: str | None = None  # None: not read (``problem`` says why)
    ready: bool | None = None
    not_ready: tuple[str, ...] = ()
    lease_mode: str | None = None
    served_shards: tuple[int, ...] = ()
    owned: int | None = None
    concurrency: int | None = None
    durability: str | None = None  # what an acknowledged request survives, as the daemon found it
    problem: str | None = None


@dataclass(frozen=True)
class DaemonsOwned:
    """Change sets owned per workspace, summed over the daemons read."""

    by_workspace: Mapping[str, int]
    read: int  # daemons whose /status was read
    problems: tuple[str, ...] = ()  # why the others could not be
    served: Mapping[str, int] = dataclasses.field(default_factory=dict)  # tasks taken lately, per workspace
    served_total: int = 0  # by every workspace (the busiest are listed in ``served``)
    daemons: tuple[DaemonLine, ...] = ()  # each daemon read (or not), in the order of the URLs given

    @property
    def known(self) -> bool:
        return self.read > 0


def busiest_workspaces(
    change_sets: Iterable[tuple[tuple[str, str], Mapping[str, int]]],
    owned: DaemonsOwned,
    *,
    limit: int = WORKSPACES_LISTED,
) -> tuple[tuple[WorkspaceLine, ...], int]:
    """The ``limit`` busiest workspaces (most change sets with a task or owned first, then most queued), and how
    many have a task, a queued request or an owned change set. ``change_sets``: ((workspace, change set),
    {"task": n, "queued": n, ...}) as ``status_report`` counts them."""
    tasks: Counter[str] = Counter()
    queued: Counter[str] = Counter()
    for (wk, _), counts in change_sets:
        if counts.get("task"):
            tasks[wk] += 1
        if counts.get("queued"):
            queued[wk] += counts["queued"]
    workspaces = set(tasks) | set(queued) | set(owned.by_workspace)

    def served(wk: str) -> float | None:
        if not owned.served_total:
            return None
        return owned.served.get(wk, 0) / owned.served_total

    lines = [
        WorkspaceLine(
            wk, tasks[wk], queued[wk], owned.by_workspace.get(wk, 0) if owned.known else None, served(wk)
        )
        for wk in workspaces
    ]
    # Owned change sets all have a task; a daemon read a moment after the streams may own one they did not show yet.
    lines.sort(key=lambda line: (-max(line.tasks, line.owned or 0), -line.queued, line.workspace_id))
    return tuple(lines[:limit]), len(lines)


class _Read(NamedTuple):
    """What one daemon's /status said: owned per workspace (None: not read, ``problem`` says why), and the tasks
    it took lately per workspace (its busiest) and in all (both empty for an older daemon)."""

    owned: Mapping[str, int] | None
    problem: str | None = None
    served: Mapping[str, int] = {}
    served_total: int = 0
    line: DaemonLine | None = None


def _http_token() -> str | None:
    """The daemons' HTTP token, as they read it (``REBASER_HTTP_TOKEN``, else the first line of
    ``REBASER_HTTP_TOKEN_FILE``): their /status wants it from another host (rebaser_server.ops.http)."""
    token = os.environ.get("REBASER_HTTP_TOKEN", "").strip()
    path = os.environ.get("REBASER_HTTP_TOKEN_FILE")
    if not token and path:
        with contextlib.suppress(OSError):
            lines = Path(path).read_text(encoding="utf-8").strip().splitlines()
            token = lines[0].strip() if lines else ""
    return token or None


def _read_one(url: str) -> _Read:
    where = f"{url.rstrip('/')}/status"
    if not where.startswith(("http://", "https://")):
        return _Read(None, f"{url}: not an http:// or https:// URL")
    token = _http_token()
    request = urllib.request.Request(where, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with _OPENER.open(request, timeout=READ_TIMEOUT) as response:
            body = response.read(_MAX_STATUS_BYTES + 1)
        if len(body) > _MAX_STATUS_BYTES:
            return _Read(None, f"{where} answered more than {_MAX_STATUS_BYTES} bytes")
        status = json.loads(body)
    except (OSError, ValueError) as err:  # URLError and timeouts are OSErrors; bad JSON a ValueError
        return _Read(None, f"{where}: {type(err).__name__} {err}".strip())
    owned = status.get("owned") if isinstance(status, dict) else None
    by_workspace = owned.get("by_workspace") if isinstance(owned, dict) else None
    if not isinstance(by_workspace, dict):
        return _Read(None, f"{where} shows no owned.by_workspace (not a rebaser daemon, or an older one)")
    assert isinstance(owned, dict)
    served, served_total = owned.get("served_by_workspace"), owned.get("served_total")  # absent: older
    return _Read(
        {str(wk): int(n) for wk, n in by_workspace.items() if isinstance(n, int)},
        served={str(wk): int(n) for wk, n in served.items() if isinstance(n, int)}
        if isinstance(served, dict)
        else {},
        served_total=served_total if isinstance(served_total, int) else 0,
        line=_daemon_line(url, status, owned),
    )


def read_daemons_owned(urls: Sequence[str]) -> DaemonsOwned:
    """Each daemon's owned change sets per workspace (``urls``: their health endpoints, ``http://host:9464``),
    summed. Read at once: a daemon that does not answer costs its timeout once."""
    if not urls:
        return DaemonsOwned({}, 0)
    with ThreadPoolExecutor(len(urls), thread_name_prefix="rebaser-daemon-status") as pool:
        reads = list(pool.map(_read_one, urls))
    total: Counter[str] = Counter()
    served: Counter[str] = Counter()
    for read in reads:
        total.update(read.owned or {})
        served.update(read.served)
    return DaemonsOwned(
        dict(total),
        sum(1 for read in reads if read.owned is not None),
        tuple(read.problem for read in reads if read.problem is not None),
        dict(served),
        sum(read.served_total for read in reads),
        tuple(
            read.line or DaemonLine(url, problem=read.problem) for url, read in zip(urls, reads, strict=True)
        ),
    )


def _daemon_line(url: str, status: Mapping[str, Any], owned: Mapping[str, Any]) -> DaemonLine:
    """The few facts of a daemon's /status an overview shows; what is missing or malformed is left unknown."""
    layout, leases, durability = status.get("layout"), status.get("leases"), status.get("durability")
    shards = layout.get("served_shards") if isinstance(layout, dict) else None
    reasons = status.get("not_ready")
    survives = durability.get("level") if isinstance(durability, dict) else None
    return DaemonLine(
        url,
        owner=str(status.get("owner", "")) or None,
        ready=status["ready"] if isinstance(status.get("ready"), bool) else None,
        not_ready=tuple(str(r) for r in reasons) if isinstance(reasons, list) else (),
        lease_mode=str(leases.get("mode")) if isinstance(leases, dict) and leases.get("mode") else None,
        served_shards=tuple(int(s) for s in shards if isinstance(s, int)) if isinstance(shards, list) else (),
        owned=owned["count"] if isinstance(owned.get("count"), int) else None,
        concurrency=owned["concurrency"] if isinstance(owned.get("concurrency"), int) else None,
        durability=str(survives) if survives is not None else None,
    )
