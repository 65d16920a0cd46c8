"""Reading a NATS server's monitoring endpoint (``/varz``) for what it promises about fsync.

Blocking and standard-library only, so the ``rebaser`` CLI can use it as it is and the daemon in a thread
(:mod:`rebaser_server.ops.durability`). What the numbers mean is :mod:`rebaser_core.nats.durability`'s.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from rebaser_core.nats.durability import ServerSync, server_sync_from_varz

__all__ = ["read_server_sync", "read_servers_sync"]

# One read may take this long; a server that does not answer in time counts as not read.
READ_TIMEOUT = 2.0
# A /varz document is a few KiB: an answer larger than this is not a NATS server's, and is not read further.
_MAX_VARZ_BYTES = 1024 * 1024

# No proxy from the environment: a monitoring endpoint is reached directly, as the NATS connection is.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def read_server_sync(url: str, *, timeout: float = READ_TIMEOUT) -> tuple[ServerSync | None, str | None]:
    """The sync setting at ``url`` (``http://host:8222``), or None and why it could not be read."""
    where = f"{url.rstrip('/')}/varz"
    if not where.startswith(("http://", "https://")):
        return None, f"{url}: not an http:// or https:// URL"
    try:
        with _OPENER.open(where, timeout=timeout) as response:
            body = response.read(_MAX_VARZ_BYTES + 1)
        if len(body) > _MAX_VARZ_BYTES:
            return None, f"{where} answered more than {_MAX_VARZ_BYTES} bytes"
        varz = json.loads(body)
    except (OSError, ValueError) as err:  # URLError and timeouts are OSErrors; bad JSON a ValueError
        return None, f"{where}: {type(err).__name__} {err}".strip()
    sync = server_sync_from_varz(varz, url) if isinstance(varz, dict) else None
    if sync is None:
        return None, f"{where} shows no JetStream configuration"
    return sync, None


def read_servers_sync(urls: Sequence[str]) -> tuple[list[ServerSync], list[str]]:
    """Every server's sync setting that could be read, and why the others could not. The servers are read at once:
    one that does not answer costs its timeout once, not once per server after it."""
    if not urls:
        return [], []
    with ThreadPoolExecutor(len(urls), thread_name_prefix="rebaser-varz") as pool:
        reads = list(pool.map(read_server_sync, urls))
    return [sync for sync, _ in reads if sync is not None], [
        problem for _, problem in reads if problem is not None
    ]
