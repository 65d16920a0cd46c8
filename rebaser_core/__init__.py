"""rebaser_core: what client and server share: the wire contract and, in :mod:`.nats`, the NATS plumbing.

The wire contract is this package's own modules. They say what goes on the wire and into the buckets, and the rules
about it: ids (:mod:`.ids`), subjects and the names of streams, buckets and consumers (:mod:`.subjects`, a subject
read back in :mod:`.subject_parsing`), tunables (:mod:`.settings`, the streams' declared in
:mod:`.stream_settings`), headers (:mod:`.headers`), versioned messages (:mod:`.api`), the error tree
(:mod:`.errors`), the shard layout (:mod:`.layout`), stored update batches (:mod:`.batches`), reply inboxes
(:mod:`.inbox`), pauses (:mod:`.pauses`), what a dead letter holds (:mod:`.dead_letter_copy`), a record's recent
replies (:mod:`.recent_replies`) and trace headers (:mod:`.tracing`). They talk to no server and never import
nats-py.

Above the wire contract, top to bottom:

- :mod:`.testing`: this project's own pytest fixtures (real nats-servers, ``wait_for``). Applications' tests use
  the plugin installed with the package, :mod:`rebaser_server.testing.pytest_plugin`.
- :mod:`.embedded`: runs a real nats-server, one node or a loopback cluster. ``rebaser-server`` starts one when
  given no NATS URL, and tests, the dev cluster and the benchmarks start them too. It is here, not in the server,
  because :mod:`.testing` needs it.
- :mod:`.nats`: the NATS plumbing and its speed work: connecting, request-reply, publishing a task, the streams'
  JetStream configurations and their creation, the buckets, durability and the servers' monitoring.

Each one may import the ones below it, and the wire contract imports none of them. The import-linter contracts in
``pyproject.toml`` enforce this: a layers contract that places every module of this package, and a contract that
only :mod:`.nats` and :mod:`.embedded` import nats-py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rebaser_core.ids import ChangeSetId, RequestId, WorkspacePk
    from rebaser_core.settings import Settings
    from rebaser_core.subjects import Subjects

__all__ = ["ChangeSetId", "RequestId", "Settings", "Subjects", "WorkspacePk"]
__version__ = "0.1.0"

# Each name is imported when first used: every module of the package (rebaser_core.errors too) runs this file first,
# and the command lines (``rebaser --help``) must not pay for pydantic's settings model then.
_WHERE = {
    "ChangeSetId": "rebaser_core.ids",
    "RequestId": "rebaser_core.ids",
    "Settings": "rebaser_core.settings",
    "Subjects": "rebaser_core.subjects",
    "WorkspacePk": "rebaser_core.ids",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rebaser_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
