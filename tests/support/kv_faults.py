"""KV writes and purges that fail halfway, switched on and off from outside a subprocess daemon.

A daemon started with ``REBASER_TEST_KV_FAULTS=<path>`` (and ``--app tests.support.apps:...``, which imports
this module)
makes every compare-and-set write to a KV bucket, and every removal of processed requests (deletes or a purge),
fail while the file at ``<path>`` exists, the way a stream leader election or a saturated server fails them: half
of them never reach the server, the other half are *done* but their answer is lost, so the daemon cannot tell
whether its write landed; and half of an owner's reads back of such a write go unanswered too, so it finds out
only at its next write. That second kind is the dangerous one: an owner that believes a commit failed when it
landed must not apply its requests again, and requests left unpurged must not be applied again when the change set
is read from the start.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import nats.errors
from nats.js.kv import KeyValue

from rebaser_server.changeset.trimmer import Trimmer
from rebaser_server.record.handle import ChangeSetHandle

_original_update = KeyValue.update
_original_create = KeyValue.create
_original_remove = Trimmer._remove
_original_commit = ChangeSetHandle._update  # a group commit's compare-and-set (over the daemon's requester)
_original_read_back = ChangeSetHandle._own_write_landed  # an owner reading back its write that got no answer


def _failing(switch: Path, original: Any) -> Any:
    async def write(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not switch.exists():  # noqa: ASYNC240 (one stat of a local file per KV write)
            return await original(self, *args, **kwargs)
        if random.random() < 0.5:
            raise nats.errors.TimeoutError  # lost on the way: nothing written
        await original(self, *args, **kwargs)
        raise nats.errors.TimeoutError  # written, but the answer lost

    return write


def _failing_read(switch: Path, original: Any) -> Any:
    async def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        if switch.exists() and random.random() < 0.5:  # noqa: ASYNC240
            raise nats.errors.TimeoutError  # the read back unanswered too: the owner cannot tell yet
        return await original(self, *args, **kwargs)

    return read


def install_from_env() -> None:
    path = os.environ.get("REBASER_TEST_KV_FAULTS")
    if path:
        switch = Path(path)
        KeyValue.update = _failing(switch, _original_update)  # type: ignore[method-assign]
        KeyValue.create = _failing(switch, _original_create)  # type: ignore[method-assign]
        Trimmer._remove = _failing(switch, _original_remove)  # type: ignore[method-assign]
        ChangeSetHandle._update = _failing(switch, _original_commit)  # type: ignore[method-assign]
        ChangeSetHandle._own_write_landed = _failing_read(switch, _original_read_back)  # type: ignore[method-assign]
